"""Your own text as a corpus: any UTF-8 file, checked before a BPE is trained on it.

Any text can stand in for tiny-shakespeare. The file gets its own byte-level BPE (cached
by the file's sha256, like the default corpus's), and `CorpusInfo` names it, so no figure
is ever compared with the book's by mistake. A file that
cannot make a corpus (missing, empty, binary, not UTF-8) is refused here with one line.
"""
from __future__ import annotations

import dataclasses
import pathlib

from attention_jax.data.corpus import CORPUS_SHA256, sha256_file
from attention_jax.errors import DataError

SNIFF_BYTES = 1 << 16


@dataclasses.dataclass(frozen=True)
class CorpusInfo:
    path: pathlib.Path
    sha256: str
    default: bool          # the chapter's tiny-shakespeare: the book's figures apply

    @property
    def name(self) -> str:
        return "tiny-shakespeare" if self.default else self.path.name

    def identity(self) -> dict:
        """What a run trained on, for its record (`train.checkpoints.run_record`): nothing for the
        default corpus (records made before other texts could be given stay what they were)."""
        return {} if self.default else {"corpus": self.name, "sha256": self.sha256}


def check_text_file(path) -> CorpusInfo:
    """A readable, non-empty UTF-8 text file, or one `DataError` line saying what is
    wrong with it."""
    p = pathlib.Path(path).expanduser()
    if not p.is_file():
        what = ("a folder, not a file" if p.is_dir() else
                "not a regular file (a pipe, device or socket)" if p.exists() else "no such file")
        raise DataError(f"{path}: {what}; give the path of a UTF-8 text file")
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(SNIFF_BYTES)
        if size == 0:
            raise DataError(f"{path}: the file is empty; "
                            "give a text of at least a few thousand words")
        if b"\x00" in head:
            raise DataError(f"{path}: this looks like a binary file (it holds NUL bytes); "
                            "give a plain UTF-8 text file")
        p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start} cannot be decoded); "
                        "convert it, e.g. iconv -t UTF-8") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read it "
                        f"({' '.join(str(e.strerror or e).split())})") from None
    digest = sha256_file(p)
    return CorpusInfo(p.absolute(), digest, digest == CORPUS_SHA256)
