"""quantkit's offline lm-eval tasks, built from the built-in held-out text (local YAML +
JSONL tasks: they run with the hub offline).

``quantkit_cloze``: for sentences of the held-out documents, pick the sentence's last word
among four choices (the right one and three words of similar length drawn, seeded, from the
same text). Easy: SmolLM2-135M scores 0.95, so it only catches a broken artifact.

``quantkit_nextword``: LAMBADA's protocol on every word of the held-out text (letters only,
4-14 of them, after the first 100 characters of its document): is the word the model's greedy
continuation of the 100 characters before it (``acc``), and its perplexity. Hard (no choices to pick
from): the baseline sits far below the ceiling, where quantization error shows; there are
thousands of items, so the stderr is small enough to tell FP8 from 4-bit RTN (measured
figures in docs/evaluation.md).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

from quantkit.paths import cache_dir

TASK_NAME = "quantkit_cloze"
NEXTWORD_TASK = "quantkit_nextword"
TASK_VERSION = 1
# Characters of context before each word: enough for the model to use its context, few enough
# that the forward pass (the task's whole cost) stays small on a CPU.
NEXTWORD_CONTEXT_CHARS = 100
_WORD = re.compile(r"^[A-Za-z]{4,14}$")


def _sentence_ends(texts: list[str]) -> list[tuple[str, str]]:
    """(context, last word) for each prose sentence of the texts that ends in a plain word."""
    found: list[tuple[str, str]] = []
    for text in texts:
        prose = [p for p in text.split("\n\n") if not p.startswith(("   ", ">>>")) and len(p) > 80]
        for paragraph in prose:
            flat = " ".join(paragraph.split())
            for sentence_end in re.finditer(r"[^.!?]{40,}?\s([A-Za-z]{4,14})\.(\s|$)", flat):
                word = sentence_end.group(1)
                if not _WORD.match(word):
                    continue
                context = flat[: sentence_end.start(1)].rstrip()
                found.append((context[-600:], word))  # keep contexts short: a few sentences
    return found


def _items(texts: list[str], seed: int = 0, limit: int = 200) -> list[dict[str, object]]:
    """Cloze items: the context up to a sentence's last word, four choices, the answer index."""
    rng = random.Random(seed)
    vocabulary = sorted({w for text in texts for w in re.findall(r"[A-Za-z]{4,14}", text)})
    items: list[dict[str, object]] = []
    for context, word in _sentence_ends(texts):
        similar = [w for w in vocabulary if abs(len(w) - len(word)) <= 2 and w.lower() != word.lower()]
        choices = [word, *rng.sample(similar, 3)]
        rng.shuffle(choices)
        items.append({"context": context, "choices": choices, "label": choices.index(word)})
    rng.shuffle(items)
    return items[:limit]


def _nextword_items(texts: list[str], seed: int = 0, limit: int = 4000) -> list[dict[str, object]]:
    """LAMBADA-style items at every plain word: the characters before it, and the word."""
    items: list[dict[str, object]] = []
    for text in texts:
        flat = " ".join(text.split())
        for match in re.finditer(r" ([A-Za-z]{4,14})(?=[\s.,;:!?)])", flat):
            start = match.start()
            if start >= NEXTWORD_CONTEXT_CHARS:
                items.append({"context": flat[start - NEXTWORD_CONTEXT_CHARS : start], "word": match[1]})
    random.Random(seed).shuffle(items)
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

_NEXTWORD_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{' ' + word}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
metadata:
  version: {version}
"""


def task_dir() -> Path:
    """A folder holding the tasks' YAML and data (built on first use, then reused)."""
    from quantkit.inputs.calibration import load_texts
    from quantkit.inputs.specs import TextSource

    texts = load_texts(TextSource(), "eval")
    tasks = {
        TASK_NAME: (_YAML, _items(texts)),
        NEXTWORD_TASK: (_NEXTWORD_YAML, _nextword_items(texts)),
    }
    data = {
        name: "\n".join(json.dumps(item, ensure_ascii=False) for item in items) + "\n"
        for name, (_, items) in tasks.items()
    }
    definitions = {name: [template, data[name]] for name, (template, _) in tasks.items()}
    digest = hashlib.sha256(json.dumps(definitions, sort_keys=True).encode()).hexdigest()[:16]
    folder = cache_dir() / "lm_eval_tasks" / f"quantkit-v{TASK_VERSION}-{digest}"
    if not all((folder / f"{name}.yaml").is_file() for name in tasks):
        from quantkit.util.fileio import cache_entry_lock, write_text_atomic

        with cache_entry_lock(folder):  # another process may be writing them: whole files only
            folder.mkdir(parents=True, exist_ok=True)
            for name, (template, _) in tasks.items():
                write_text_atomic(folder / f"{name}.jsonl", data[name])
                yaml_text = template.format(name=name, data=folder / f"{name}.jsonl", version=TASK_VERSION)
                write_text_atomic(folder / f"{name}.yaml", yaml_text)
    return folder


def data_digest() -> str:
    """Identifies the task data (part of the baseline cache key)."""
    return task_dir().name
