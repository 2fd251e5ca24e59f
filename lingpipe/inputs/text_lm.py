"""TextLmInput: byte-level language-model batches from English text.

Vocabulary: id = byte + 3 for the 256 bytes; 0 is padding, 1 begins a sequence
(BOS), 2 ends a document (EOS); 259 ids in all.

Text: the files of `file_pattern` (each paragraph, separated by blank lines, is a
document), or by default a built-in corpus of real English, assembled at run time
from text every Python installation carries: the docstrings of a fixed, sorted
list of pure-Python standard library modules (about 1.1 MB on Python 3.11).
Each document goes to 'train', 'dev' or 'test' by a hash of its bytes
(crc32 % 100: below 90 train, below 95 dev, else test), so the split of a
document never depends on the others.

A split's documents are concatenated, each followed by EOS, and cut into windows
of seq_len ids. An example is one window as labels, and BOS plus the window
shifted by one as ids:

    ids      [t] int32    BOS, x0, x1, ..., x(t-2)
    labels   [t] int32    x0, x1, ..., x(t-1)
    paddings [t] float32  1.0 past the end of the split's last (partial) window
    weights  [t] float32  1 - paddings
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import zlib

import numpy as np
import tensorflow as tf

from lingpipe import asserts, hyperparams
from lingpipe.inputs import base_input
from lingpipe.nested_map import NestedMap

__all__ = [
    "BOS_ID",
    "BYTE_OFFSET",
    "BYTE_VOCAB_SIZE",
    "BuiltInDocuments",
    "EOS_ID",
    "FileDocuments",
    "PAD_ID",
    "SplitIds",
    "SplitOf",
    "TextLmInput",
]

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
BYTE_OFFSET = 3
BYTE_VOCAB_SIZE = 256 + BYTE_OFFSET

# Pure-Python standard library modules (plus builtins and a few C modules whose
# docstrings are plain English) whose docstrings make the built-in corpus. Sorted
# before use; a module this Python lacks is skipped.
_CORPUS_MODULES = """
abc argparse ast asyncio.base_events asyncio.base_subprocess asyncio.events
asyncio.futures asyncio.locks asyncio.queues asyncio.runners asyncio.selector_events
asyncio.sslproto asyncio.streams asyncio.subprocess asyncio.tasks asyncio.transports
asyncio.unix_events base64 bdb bisect builtins bz2 calendar cmd code codecs codeop
collections collections.abc colorsys compileall concurrent.futures._base
concurrent.futures.process concurrent.futures.thread configparser contextlib copy
copyreg csv ctypes ctypes.util dataclasses datetime dbm decimal difflib dis doctest
email._header_value_parser email._parseaddr email._policybase email.charset
email.contentmanager email.feedparser email.generator email.header
email.headerregistry email.iterators email.message email.parser email.policy
email.utils enum filecmp fileinput fnmatch fractions ftplib functools genericpath
getopt getpass gettext glob graphlib gzip hashlib heapq hmac html.parser http.client
http.cookiejar http.cookies http.server imaplib importlib._bootstrap
importlib._bootstrap_external importlib.abc importlib.machinery importlib.metadata
importlib.util inspect io ipaddress itertools json json.decoder json.encoder
json.scanner linecache locale logging logging.config logging.handlers lzma mailbox
math mimetypes modulefinder multiprocessing.connection multiprocessing.context
multiprocessing.managers multiprocessing.pool multiprocessing.process
multiprocessing.queues multiprocessing.synchronize netrc numbers operator optparse os
pathlib pdb pickle pickletools pkgutil platform plistlib poplib posixpath pprint
profile pstats py_compile pyclbr pydoc queue quopri random re reprlib runpy sched
secrets selectors shelve shlex shutil smtplib socket socketserver ssl stat statistics
string subprocess symtable sysconfig tabnanny tarfile tempfile textwrap threading
timeit token tokenize tomllib trace traceback tracemalloc types typing unittest.async_case
unittest.case unittest.loader unittest.mock unittest.result unittest.runner
unittest.suite unittest.util urllib.error urllib.parse urllib.request urllib.response
urllib.robotparser uuid warnings wave weakref webbrowser wsgiref.handlers
wsgiref.headers wsgiref.simple_server wsgiref.util wsgiref.validate xml.dom.expatbuilder
xml.dom.minidom xml.dom.pulldom xml.etree.ElementPath xml.etree.ElementTree
xml.sax.expatreader xml.sax.handler xml.sax.saxutils xml.sax.xmlreader xmlrpc.client
xmlrpc.server zipapp zipfile zipimport zoneinfo
"""
# A docstring is kept if it is this long and mostly English letters and spaces.
_MIN_DOC_CHARS = 40
_MIN_LETTER_FRACTION = 0.8


def _IsEnglishLike(doc: str) -> bool:
    letters = sum(c.isascii() and (c.isalpha() or c.isspace()) for c in doc)
    return len(doc) >= _MIN_DOC_CHARS and letters >= _MIN_LETTER_FRACTION * len(doc)


@functools.lru_cache(maxsize=1)
def BuiltInDocuments() -> tuple[bytes, ...]:
    """The built-in corpus: English docstrings of stdlib modules, classes and functions.

    Deterministic for one Python installation: modules in sorted order, their
    members sorted by name, each distinct docstring once, as UTF-8.
    """
    docs: list[bytes] = []
    seen: set[str] = set()

    def Add(obj: object) -> None:
        doc = inspect.getdoc(obj)
        if doc and doc not in seen and _IsEnglishLike(doc):
            seen.add(doc)
            docs.append(doc.encode("utf-8"))

    for module_name in sorted(_CORPUS_MODULES.split()):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        Add(module)
        for _, member in sorted(vars(module).items()):
            if getattr(member, "__module__", None) != module.__name__:
                continue
            if inspect.isclass(member):
                Add(member)
                for _, attr in sorted(vars(member).items()):
                    if isinstance(attr, (classmethod, staticmethod)):
                        attr = attr.__func__
                    if inspect.isroutine(attr) or isinstance(attr, property):
                        Add(attr)
            elif inspect.isroutine(member):
                Add(member)
    return tuple(docs)


def FileDocuments(file_pattern: str) -> tuple[bytes, ...]:
    """The paragraphs (separated by blank lines) of the files matching `file_pattern`.

    Raises:
      ValueError: nothing matches, a file cannot be read, or the files hold no text.
    """
    files = sorted(tf.io.gfile.glob(file_pattern))
    if not files:
        raise ValueError(
            f"TextLmInput: file_pattern={file_pattern!r} matches no files; expected a glob "
            "of text files, or '' for the built-in corpus"
        )
    docs: list[bytes] = []
    for path in files:
        try:
            with tf.io.gfile.GFile(path, "rb") as f:
                text = f.read()
        except (OSError, tf.errors.OpError) as e:
            raise ValueError(
                f"TextLmInput: cannot read {path!r} (matched by file_pattern={file_pattern!r}): {e}"
            ) from e
        docs.extend(d.strip() for d in re.split(rb"\n[ \t\r]*\n", text) if d.strip())
    if not docs:
        raise ValueError(
            f"TextLmInput: file_pattern={file_pattern!r} matches {len(files)} files, but they "
            "hold no text"
        )
    return tuple(docs)


def SplitOf(document: bytes) -> str:
    """The split of a document: 'train', 'dev' or 'test', by crc32 of its bytes."""
    bucket = zlib.crc32(document) % 100
    return "train" if bucket < 90 else "dev" if bucket < 95 else "test"


def SplitIds(documents: tuple[bytes, ...], split: str) -> np.ndarray:
    """[n] int32: the ids of `split`'s documents in order, each followed by EOS."""
    parts = []
    for doc in documents:
        if SplitOf(doc) == split:
            parts.append(np.frombuffer(doc, np.uint8).astype(np.int32) + BYTE_OFFSET)
            parts.append(np.array([EOS_ID], np.int32))
    return np.concatenate(parts) if parts else np.zeros([0], np.int32)


class TextLmInput(base_input.BaseInputGenerator):
    """Byte-level language-model batches (see the module docstring).

    Batch: NestedMap(ids, labels, paddings, weights), each [batch, seq_len].
    """

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define(
            "file_pattern",
            "",
            "Glob of text files; each paragraph is a document. '' means the built-in corpus "
            "of standard library docstrings.",
        )
        p.Define("seq_len", 64, "Length of every example: ids, labels, paddings and weights.")
        p.Define(
            "vocab_size",
            BYTE_VOCAB_SIZE,
            f"Number of ids; the byte vocabulary needs {BYTE_VOCAB_SIZE} for arbitrary data.",
        )
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        asserts.Positive(p.seq_len, "seq_len", where=self.where)
        asserts.Positive(p.vocab_size, "vocab_size", where=self.where)
        if not isinstance(p.file_pattern, str):
            raise ValueError(
                f"{self.where}: expected file_pattern to be a str (a glob, or ''), received "
                f"file_pattern={p.file_pattern!r}"
            )
        documents = FileDocuments(p.file_pattern) if p.file_pattern else BuiltInDocuments()
        self._ids = {split: SplitIds(documents, split) for split in base_input.SPLITS}
        largest = max(int(ids.max(initial=0)) for ids in self._ids.values())
        if largest >= p.vocab_size:
            raise ValueError(
                f"{self.where}: vocab_size={p.vocab_size} cannot hold the data, whose largest "
                f"id is {largest} (byte {largest - BYTE_OFFSET}); expected vocab_size >= "
                f"{largest + 1}, or {BYTE_VOCAB_SIZE} for any bytes"
            )
        if not self._ids[p.split].size:
            source = repr(p.file_pattern) if p.file_pattern else "the built-in corpus"
            raise ValueError(
                f"{self.where}: split {p.split!r} of {source} is empty: documents go to "
                "splits by a hash of their bytes (90% train, 5% dev, 5% test), so give "
                "more paragraphs (separated by blank lines)"
            )
        ids = self._ids[p.split]
        num_windows = -(-len(ids) // p.seq_len)
        labels = np.zeros([num_windows * p.seq_len], np.int32)
        labels[: len(ids)] = ids
        self._labels = tf.constant(labels.reshape([num_windows, p.seq_len]))

    @property
    def vocab_size(self) -> int:
        """Number of ids (the `vocab_size` param, 259 by default)."""
        return self.params.vocab_size

    def SplitIds(self, split: str | None = None) -> np.ndarray:
        """[n] int32: every id of `split` in order (documents each followed by EOS)."""
        return self._ids[self._CheckSplit(split)]

    def NumExamples(self, split: str | None = None) -> int:
        return -(-len(self.SplitIds(split)) // self.params.seq_len)

    def UnigramEntropy(self, split: str | None = None) -> float:
        """Cross-entropy, in nats per id, of `split` under the train split's unigram model.

        The unigram model counts every id of 'train' plus one (add-one smoothing over
        the vocabulary). A language model should do better than this.
        """
        counts = np.bincount(self._ids["train"], minlength=self.vocab_size) + 1.0
        log_probs = np.log(counts / counts.sum())
        return float(-np.mean(log_probs[self.SplitIds(split)]))

    def _Example(self, index: tf.Tensor) -> NestedMap:
        labels = tf.gather(self._labels, index)
        paddings = tf.cast(tf.equal(labels, PAD_ID), tf.float32)
        ids = tf.concat([tf.constant([BOS_ID], tf.int32), labels[:-1]], axis=0)
        ids *= tf.cast(1.0 - paddings, tf.int32)
        return NestedMap(ids=ids, labels=labels, paddings=paddings, weights=1.0 - paddings)
