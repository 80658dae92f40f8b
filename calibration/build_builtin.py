"""Regenerate the built-in text set from the Python documentation shipped with CPython.

Source: ``pydoc_data.topics`` (the "Python Language Reference" topic texts that ``help()``
shows), PSF License. Run with the interpreter recorded in ``calibration/README.md`` to get
byte-identical files; the committed files, not this script, are what quantkit reads.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

MAX_CHARS = 1600  # documents are groups of whole paragraphs up to about this size
EVAL_SHARE = 0.2  # fraction of documents held out for evaluation


def _documents() -> list[tuple[str, str]]:
    from pydoc_data.topics import topics

    docs: list[tuple[str, str]] = []
    seen: set[str] = set()  # topics repeat sections; keep each paragraph once, so the
    for topic in sorted(topics):  # calibration and evaluation parts share no paragraph
        paragraphs = []
        for para in topics[topic].split("\n\n"):
            para = para.strip("\n")
            if para.strip() and para not in seen:
                seen.add(para)
                paragraphs.append(para)
        chunk: list[str] = []
        size = 0
        part = 0
        for para in paragraphs:
            if chunk and size + len(para) > MAX_CHARS:
                docs.append((f"{topic}#{part}", "\n\n".join(chunk)))
                chunk, size, part = [], 0, part + 1
            chunk.append(para)
            size += len(para) + 2
        if chunk:
            docs.append((f"{topic}#{part}", "\n\n".join(chunk)))
    return docs


def _is_eval(doc_id: str) -> bool:
    digest = hashlib.sha256(doc_id.encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < EVAL_SHARE


def main(out_dir: Path) -> None:
    docs = _documents()
    out_dir.mkdir(parents=True, exist_ok=True)
    with (
        (out_dir / "calib.jsonl").open("w", encoding="utf-8") as calib,
        (out_dir / "eval.jsonl").open("w", encoding="utf-8") as held_out,
    ):
        for doc_id, text in docs:
            target = held_out if _is_eval(doc_id) else calib
            target.write(json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n")
    print(f"{len(docs)} documents written to {out_dir} (python {sys.version.split()[0]})")


if __name__ == "__main__":
    main(Path(__file__).resolve().parent / "builtin")
