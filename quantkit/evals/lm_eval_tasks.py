"""quantkit's offline lm-eval task, built from the built-in held-out text.

``quantkit_cloze``: for sentences of the held-out documents, predict the sentence's last
word among four choices (the right one and three words of similar length drawn, seeded,
from the same text). A local YAML + JSONL task: it runs with the hub offline.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

from quantkit.paths import cache_dir

TASK_NAME = "quantkit_cloze"
TASK_VERSION = 1
_WORD = re.compile(r"^[A-Za-z]{4,14}$")


def _items(texts: list[str], seed: int = 0, limit: int = 200) -> list[dict[str, object]]:
    """Cloze items: the context up to a sentence's last word, four choices, the answer index."""
    rng = random.Random(seed)
    vocabulary = sorted({w for text in texts for w in re.findall(r"[A-Za-z]{4,14}", text)})
    items: list[dict[str, object]] = []
    for text in texts:
        prose = [p for p in text.split("\n\n") if not p.startswith(("   ", ">>>")) and len(p) > 80]
        for paragraph in prose:
            flat = " ".join(paragraph.split())
            for sentence_end in re.finditer(r"[^.!?]{40,}?\s([A-Za-z]{4,14})\.(\s|$)", flat):
                word = sentence_end.group(1)
                if not _WORD.match(word):
                    continue
                context = flat[: sentence_end.start(1)].rstrip()
                context = context[-600:]  # keep contexts short: a few sentences
                similar = [
                    w for w in vocabulary if abs(len(w) - len(word)) <= 2 and w.lower() != word.lower()
                ]
                choices = [word, *rng.sample(similar, 3)]
                rng.shuffle(choices)
                items.append({"context": context, "choices": choices, "label": choices.index(word)})
    rng.shuffle(items)
    return items[:limit]


_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "{{{{choices}}}}"
target_delimiter: " "
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: {version}
"""


def task_dir() -> Path:
    """A folder holding the task YAML and its data (built on first use, then reused)."""
    from quantkit.calibration import load_texts
    from quantkit.specs import TextSource

    texts = load_texts(TextSource(), "eval")
    items = _items(texts)
    data = "\n".join(json.dumps(item, ensure_ascii=False) for item in items) + "\n"
    digest = hashlib.sha256(data.encode()).hexdigest()[:16]
    folder = cache_dir() / "lm_eval_tasks" / f"{TASK_NAME}-v{TASK_VERSION}-{digest}"
    if not (folder / f"{TASK_NAME}.yaml").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{TASK_NAME}.jsonl").write_text(data, encoding="utf-8")
        yaml_text = _YAML.format(name=TASK_NAME, data=folder / f"{TASK_NAME}.jsonl", version=TASK_VERSION)
        (folder / f"{TASK_NAME}.yaml").write_text(yaml_text, encoding="utf-8")
    return folder


def data_digest() -> str:
    """Identifies the task data (part of the baseline cache key)."""
    return task_dir().name
