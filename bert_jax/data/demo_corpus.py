"""The offline demo corpus: English prose from CPython's own help topics and standard-library docstrings.

Run as a script in a fresh `python -I -S` by corpus.demo_corpus_text, so it imports the standard library only, and
cuts sentences with its own small rule set (`split_sentences_by_rules`): user corpora go through sentencex
(corpus.split_sentences, docs/data.md), but the demo corpus must build without third-party packages, and its
figures are pinned.
"""

from __future__ import annotations

import importlib
import inspect
import re
import warnings
from typing import Iterator

# Words that end with a period without ending the sentence. Compared in lower case, without the final period.
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st mt vs etc e.g i.e cf al fig figs eq eqs vol vols approx ca resp dept inc ltd "
    "corp jan feb mar apr jun jul aug sep sept oct nov dec".split())
_CLOSERS = "\"')]}\u201d\u2019"
_OPENERS = "\"'([{\u201c\u2018"
# A run of terminators, optional closing quotes or brackets, then whitespace: a candidate sentence end.
_CANDIDATE_END = re.compile(rf"[.!?]+[{re.escape(_CLOSERS)}]*\s+")
_MULTI_INITIALS = re.compile(r"(?:[^\W\d_]\.)+[^\W\d_]")  # U.S, e.g, p.m: the token before the final period


def split_sentences_by_rules(paragraph: str) -> list[str]:
    """Splits prose into sentences with a small rule set; whitespace runs become single spaces.

    The demo corpus is built with these rules, as it is built without third-party packages (and its figures are
    pinned); user corpora go through `split_sentences`, more accurate and faster (docs/data.md, Sentence splitting).

    A sentence ends after '.', '!' or '?' (possibly repeated, possibly followed by closing quotes or brackets) when
    whitespace and then an upper-case letter, a digit or an opening quote follow. A period does not end a sentence
    after a common abbreviation ("e.g.", "i.e.", "Mr.", "Dr.", "etc.", ...), a single capital initial ("J. Smith")
    or dotted initials ("U.S.", "p.m."); decimals ("3.14") never split because no whitespace follows the period.

    Limits: English rules only; a sentence that really does end with an abbreviation or an initial is joined to the
    next one; a sentence starting with a lower-case letter is joined to the previous one; scripts without spaces
    between sentences (Chinese, Japanese) are not split.
    """
    text = " ".join(paragraph.split())
    sentences, start = [], 0
    for match in _CANDIDATE_END.finditer(text):
        following = text[match.end()]  # the whitespace was collapsed and stripped, so a character follows
        if not (following.isupper() or following.isdigit() or following in _OPENERS):
            continue
        if text[match.start()] == "." and _is_abbreviation(text, match.start()):
            continue
        sentences.append(text[start:match.end()].strip())
        start = match.end()
    if start < len(text):
        sentences.append(text[start:].strip())
    return [sentence for sentence in sentences if sentence]


def _is_abbreviation(text: str, period: int) -> bool:
    word = text[text.rfind(" ", 0, period) + 1:period].lstrip(_OPENERS)
    single_initial = len(word) == 1 and word.isupper()
    return word.lower() in _ABBREVIATIONS or single_initial or bool(_MULTI_INITIALS.fullmatch(word))


# Standard-library modules whose docstrings join the demo corpus: importable everywhere CPython runs, quick to
# import, without side effects and not deprecated. Changing this list changes the corpus, so keep it sorted.
DEMO_MODULES = tuple("""
    _collections_abc _pydecimal _pyio _threading_local abc argparse array ast asyncio.base_events asyncio.events
    asyncio.locks asyncio.protocols asyncio.queues asyncio.runners asyncio.selector_events asyncio.streams
    asyncio.tasks asyncio.transports base64 bdb binascii bisect builtins bz2 calendar cmath cmd code codecs codeop
    collections collections.abc colorsys compileall concurrent.futures concurrent.futures._base configparser
    contextlib contextvars copy copyreg csv dataclasses datetime dbm dbm.dumb difflib dis doctest email
    email._header_value_parser email._parseaddr email._policybase email.base64mime email.charset email.encoders
    email.errors email.feedparser email.generator email.header email.headerregistry email.iterators email.message
    email.parser email.policy email.quoprimime email.utils enum filecmp fileinput fnmatch fractions ftplib
    functools gc genericpath getopt getpass gettext glob graphlib gzip hashlib heapq hmac html html.parser http
    http.client http.cookiejar http.cookies http.server imaplib importlib importlib.abc importlib.metadata
    importlib.resources importlib.resources.abc importlib.util inspect io ipaddress itertools json json.decoder
    json.encoder keyword linecache locale logging logging.config logging.handlers lzma mailbox marshal math
    mimetypes modulefinder multiprocessing.connection multiprocessing.context multiprocessing.managers
    multiprocessing.pool multiprocessing.reduction multiprocessing.shared_memory netrc numbers opcode operator
    optparse os pathlib pdb pickle pickletools pkgutil platform plistlib poplib posixpath pprint profile pstats
    py_compile pyclbr pydoc queue quopri random re reprlib rlcompleter runpy sched secrets select selectors shelve
    shlex shutil signal smtplib socket socketserver ssl stat statistics string stringprep struct subprocess symtable
    sys sysconfig tabnanny tarfile tempfile textwrap threading time timeit token tokenize trace traceback
    tracemalloc types typing unicodedata unittest unittest.case unittest.loader unittest.mock unittest.result
    unittest.util urllib.error urllib.parse urllib.request urllib.response urllib.robotparser uuid warnings wave
    weakref wsgiref.handlers wsgiref.headers wsgiref.simple_server wsgiref.util wsgiref.validate xml.dom.expatbuilder
    xml.dom.minidom xml.dom.pulldom xml.etree.ElementTree xml.sax xml.sax._exceptions xml.sax.handler
    xml.sax.saxutils xml.sax.xmlreader xmlrpc.client xmlrpc.server zipapp zipfile zipimport zlib zoneinfo
    """.split())
_MIN_DOCUMENT_SENTENCES = 4  # a class documented more briefly joins its module's document
_PROSE_END = re.compile(rf"[.!?:][{re.escape(_CLOSERS)}]*$")
_LIST_MARKER = re.compile(r"^(?:[-*+\u2022]|\(?\d+[.)]|\(?[a-z][.)])\s+")
_LETTER = re.compile(r"[^\W\d_]")
_BLANK_LINES = re.compile(r"\n(?:[ \t]*\n)+")


def _demo_text_here() -> str:
    return "".join("\n".join(document) + "\n\n" for document in _iter_demo_documents_here() if document)


def _iter_demo_documents_here() -> Iterator[list[str]]:
    from pydoc_data.topics import topics  # pylint: disable=import-outside-toplevel

    for key in sorted(topics):
        yield _prose_sentences(topics[key])
    # The same docstring can hang off several names (aliases, re-exports); it is used once, where first met.
    seen_docstrings: set[str] = set()
    for module_name in DEMO_MODULES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                module = importlib.import_module(module_name)
            except ImportError:  # a trimmed-down Python build; the corpus is then smaller, but still fixed
                continue
            yield from _module_documents(module, seen_docstrings)


def _module_documents(module, seen_docstrings: set[str]) -> Iterator[list[str]]:
    def sentences_of(obj) -> list[str]:
        doc = getattr(obj, "__doc__", None)
        if not isinstance(doc, str) or doc in seen_docstrings:
            return []
        seen_docstrings.add(doc)
        return _prose_sentences(inspect.cleandoc(doc))

    # C accelerators define what their module re-exports: heapq's functions say they live in '_heapq'.
    owners = {module.__name__, "_" + module.__name__.rpartition(".")[2]}
    module_document = sentences_of(module)
    class_documents = []
    for member in _documented_members(module, owners):
        if inspect.isclass(member):
            document = sentences_of(member)
            for method in _documented_members(member, None):
                document.extend(sentences_of(method))
            if len(document) >= _MIN_DOCUMENT_SENTENCES:
                class_documents.append(document)
            else:
                module_document.extend(document)
        else:
            module_document.extend(sentences_of(member))
    yield module_document
    yield from class_documents


def _documented_members(namespace, owners: set[str] | None) -> list[object]:
    """Classes and routines defined in `namespace` (in a module named in `owners`, when given), sorted by name.

    Private helpers and dunder methods count too: their docstrings are prose like any other (boilerplate ones are
    used once, like every repeated docstring), and the public ones alone give little more than half the text.
    """
    members = []
    for name, member in sorted(vars(namespace).items()):
        if name in ("__doc__", "__builtins__"):
            continue
        if isinstance(member, (classmethod, staticmethod)):
            member = member.__func__
        if not (inspect.isclass(member) or inspect.isroutine(member) or isinstance(member, property)):
            continue
        if owners is not None and getattr(member, "__module__", None) not in owners:
            continue
        members.append(member)
    return members


def _prose_sentences(text: str) -> list[str]:
    """The sentences of a help text's prose paragraphs; headings, code, grammar rules and tables are left out."""
    sentences = []
    for paragraph in _prose_paragraphs(text):
        sentences.extend(sentence for sentence in split_sentences_by_rules(paragraph) if _looks_like_prose(sentence))
    return sentences


def _prose_paragraphs(text: str) -> Iterator[str]:
    for block in _BLANK_LINES.split(text):
        lines, kept = [line for line in block.splitlines() if line.strip()], []
        for line in lines:
            # A doctest runs to the end of its block; lines indented deeper than the paragraph start are code.
            if line.strip().startswith((">>>", "...")) or _indent(line) >= _indent(lines[0]) + 4:
                break
            kept.append(line.strip())
        paragraph = _LIST_MARKER.sub("", " ".join(kept))
        # Headings, code and tables do not end like a sentence; grammar productions contain '::='.
        if paragraph and _PROSE_END.search(paragraph) and "::=" not in paragraph:
            yield paragraph


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _looks_like_prose(sentence: str) -> bool:
    visible = sentence.replace(" ", "")
    letters = len(_LETTER.findall(visible))
    return sentence.count(" ") >= 2 and letters >= 0.75 * len(visible) and sentence[0].isupper()
