"""The Ray executor: each run is a Ray task on a cluster (``ray start --head`` plus workers),
placed by its resources (``num_gpus=1`` for CUDA runs, ``num_cpus`` on the CPU). Runs write
into a folder every node sees; a task whose worker dies is retried by Ray, and the retry
resumes the run from its journal."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlparse

from quantkit.errors import MissingDependencyError, UserInputError
from quantkit.sweep.baseline import BaselineJob, BaselineOutcome
from quantkit.sweep.spec import SweepSpec
from quantkit.sweep.task import RunOutcome, RunTask
from quantkit.util.progress import Reporter

RAY_HINT = "start a cluster with `ray start --head` (and `ray start --address HEAD:6379` on each worker)"
AUTH_HINT = (
    "export RAY_AUTH_MODE=token, and RAY_AUTH_TOKEN_PATH=<the head's token file> unless the token "
    "is in ~/.ray/auth_token here (see docs/sweeps.md, 'Token authentication')"
)


def ray_execute(task_json: str) -> str:
    """The Ray task: run one point of the sweep on whichever node Ray chose."""
    import ray

    from quantkit.sweep.task import execute

    outcome = execute(RunTask.model_validate_json(task_json))
    outcome.node = ray.get_runtime_context().get_node_id()
    return outcome.model_dump_json()


def ray_baselines(job_json: str) -> str:
    """The Ray task of the baseline phase, on a worker with the runs' resources."""
    import ray

    from quantkit.sweep.baseline import run_baseline_job

    outcome = run_baseline_job(BaselineJob.model_validate_json(job_json), Reporter())
    for record in outcome.baselines:
        record.node = ray.get_runtime_context().get_node_id()
    return outcome.model_dump_json()


def _host_port(address: str) -> tuple[str, int] | None:
    """The (host, port) to probe for ``address``, or None for 'auto'/'local'."""
    if address in ("auto", "local"):
        return None
    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    if parsed.hostname is None:
        raise UserInputError(f"bad Ray address '{address}'", "give host:port, ray://host:10001 or auto")
    try:
        port = parsed.port
    except ValueError:
        raise UserInputError(f"bad Ray address '{address}'", "the port must be a number") from None
    return parsed.hostname, port or (10001 if parsed.scheme == "ray" else 6379)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _is_auth_error(err: BaseException) -> bool:
    """Ray's refusal of a driver without the cluster's token (raised as such, or wrapped in the
    RuntimeError of a failed GCS connection)."""
    from ray.exceptions import AuthenticationError

    text = str(err)
    return isinstance(err, AuthenticationError) or "InvalidAuthToken" in text or "AuthenticationError" in text


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RayExecutor:
    name: ClassVar[str] = "ray"

    def __init__(self, spec: SweepSpec, folder: Path) -> None:
        self.spec = spec
        self.folder = folder
        self.address = spec.ray.address
        self._resources(spec.device == "cuda")

    def _resources(self, on_gpu: bool) -> None:
        """Each task's resources: ``ray.num_gpus``/``num_cpus`` when given, else one GPU per run
        on GPUs and one CPU per run on the CPU."""
        ray_spec = self.spec.ray
        self.on_gpu = on_gpu
        gpus, cpus = ray_spec.num_gpus, ray_spec.num_cpus
        self.num_gpus = gpus if gpus is not None else (1.0 if on_gpu else 0.0)
        self.num_cpus = cpus if cpus is not None else (0.0 if self.num_gpus else 1.0)

    def check(self) -> None:
        try:
            import ray
        except ImportError:
            raise MissingDependencyError(
                "the Ray executor needs Ray", "pip install 'quantkit[ray]'"
            ) from None
        target = _host_port(self.address)
        if target is not None:
            try:
                socket.create_connection(target, timeout=3).close()
            except OSError as err:
                raise UserInputError(
                    f"no Ray cluster answers at {self.address} ({err.strerror or err})", RAY_HINT
                ) from None
            if "://" not in self.address:  # a GCS address (ray:// is Ray Client's server)
                self._check_token(target)
        self._connect()
        if self.spec.device in (None, "auto"):  # 'auto' means a GPU per run on a cluster with GPUs
            import ray

            self._resources(float(ray.cluster_resources().get("GPU", 0)) > 0)

    def _check_token(self, target: tuple[str, int]) -> None:
        """Ask the GCS for the cluster's id, as ``ray start --address`` does first: a cluster with
        token authentication refuses a driver without its token at once (``ray.init`` would
        retry for tens of seconds and then report a failed connection)."""
        from ray._raylet import GcsClient  # type: ignore[attr-defined]
        from ray.exceptions import AuthenticationError

        from quantkit.util.progress import native_stderr_captured

        try:
            with native_stderr_captured(verbose=False, source="ray"):  # the C++ client logs each refusal
                GcsClient(address=f"{target[0]}:{target[1]}").cluster_id  # noqa: B018
        except AuthenticationError:
            raise UserInputError(
                f"the Ray cluster at {self.address} requires token authentication", AUTH_HINT
            ) from None
        except Exception:  # anything else is ray.init's to report, in its words
            return

    def _connect(self) -> None:
        import ray

        if ray.is_initialized():
            return
        target = _host_port(self.address)
        on_this_machine = self.address == "local" or (target is not None and _is_loopback(target[0]))
        node_ip = "127.0.0.1" if on_this_machine else None  # a cluster here: stay on loopback
        try:
            ray.init(
                address=None if self.address == "local" else self.address,
                include_dashboard=False if self.address == "local" else None,
                log_to_driver=False,
                logging_level=logging.WARNING,
                _node_ip_address=node_ip,
            )
        except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as err:
            if _is_auth_error(err):
                raise UserInputError(
                    f"the Ray cluster at {self.address} requires token authentication", AUTH_HINT
                ) from None
            first = _first_line(err)
            raise UserInputError(
                f"cannot join the Ray cluster at {self.address}: {first}", RAY_HINT
            ) from None

    def describe(self) -> str:
        return (
            f"ray: {self.address}, each run a task (num_cpus={self.num_cpus:g}, num_gpus={self.num_gpus:g})"
        )

    def threads(self) -> int | None:
        return None if self.num_gpus else max(1, int(self.num_cpus))

    def _options(self) -> dict[str, float | int | bool]:
        return {
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "max_retries": self.spec.ray.max_retries,
            "retry_exceptions": False,  # a run's own failure is its outcome; only a lost worker retries
        }

    def baselines(self, job: BaselineJob, reporter: Reporter) -> BaselineOutcome:
        import ray

        self._connect()
        remote = ray.remote(ray_baselines).options(**self._options())
        job = job.model_copy(update={"threads": self.threads()})  # the runs' share of a node
        with reporter.stage("baseline (reference, lm-eval, bench) on a Ray worker, once for the sweep"):
            ref = remote.remote(job.model_dump_json())
            try:
                return BaselineOutcome.model_validate_json(ray.get(ref))
            except ray.exceptions.RayError as err:  # retries exhausted: the worker kept dying
                first = _first_line(err)
                return BaselineOutcome(error=f"the baseline task failed on Ray: {first}", exit_code=3)
            except BaseException:  # Ctrl-C: stop it on the cluster too
                ray.cancel(ref, force=True)
                ray.shutdown()
                raise

    def run(self, tasks: list[RunTask], done: Callable[[RunOutcome], None]) -> None:
        import ray

        self._connect()
        remote = ray.remote(ray_execute).options(**self._options())
        pending = {remote.remote(task.model_dump_json()): task for task in tasks}
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                task = pending.pop(ready[0])
                try:
                    done(RunOutcome.model_validate_json(ray.get(ready[0])))
                except ray.exceptions.RayError as err:  # retries exhausted: the worker kept dying
                    first = _first_line(err)
                    done(
                        RunOutcome(
                            run_id=task.run_id,
                            state="failed",
                            exit_code=3,
                            error=f"the Ray task failed: {first}",
                            hint="run the sweep again: the run resumes from its completed stages",
                        )
                    )
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        finally:
            ray.shutdown()
