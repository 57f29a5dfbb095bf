"""Short names for kernels, as a person reads them in a table: a demangled C++ signature (``void
at::native::elementwise_kernel<128, 2, ...>(int, ...)``) as the function's own name (``elementwise_kernel``),
without its return type, namespaces, template arguments and parameters; a mangled one (``_ZN5aiter24add_...``)
likewise; a plain name (``ampere_sgemm_128x64_nn``, ``triton_poi_fused_add_0``) as it is. A short name is at
most ``WIDTH`` characters and holds neither ``(`` nor ``<``.

``short_names`` keeps the names of one table apart: where full names shorten alike, each gets the least that
tells it from the others, the words where it first differs from each of them (a template argument, a
parameter, a namespace: ``elementwise_kernel[CUDAFunctor_add]``, ``cublasLt::splitKreduce_kernel``), less
what most of them share there (of three kernels of vector width 4 and one of 2, only the one says ``2``), and
a number where even those agree (``#2``). JSON and CSV keep the full name beside it (``KernelStat.name_full``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

WIDTH = 80  # most characters of a short name
TAG_WIDTH = 40  # most characters of the words that tell a name from its namesakes, brackets included
TAG_WORDS = 4  # most words a tag shows
SCOPE_WIDTH = 24  # most characters of a namespace put before a name to tell it apart

#: Wrappers whose own name says nothing (``cutlass::Kernel<cutlass_80_tensorop_s1688gemm_...>``): the kernel
#: is named by its first template argument that names a type.
GENERIC = frozenset({"Kernel", "Kernel2", "kernel", "device_kernel", "kentry", "kernel_entry", "global_kernel"})
#: Namespaces that say nothing about a kernel: left out of the scope that tells namesakes apart.
QUIET = frozenset({"at", "native", "detail", "std", "c10", "cuda", "impl", "internal"})
#: Words of a signature that tell nothing apart: qualifiers, the words of lambdas and operators, and
#: the placeholders (``T1``) newer compilers write for template parameters.
FILLER = frozenset({"const", "volatile", "void", "lambda", "operator", "instance", "struct", "class", "enum",
                    "typename", "decltype", "restrict", "__restrict__"})
BUILTIN = frozenset({"bool", "char", "short", "int", "long", "float", "double", "unsigned", "signed", "void",
                     "half", "__half", "size_t", "true", "false", "nullptr", "decltype"})

_ANONYMOUS = re.compile(r"\(anonymous namespace\)::|<unnamed>::|\{anonymous\}::|`anonymous namespace'::")
_TRAILING = re.compile(r"(\s*(const|volatile|noexcept|&&|&))+$")
_CAST = re.compile(r"\((?:[\w$]+(?:::|\s))*[\w$]+\)(?=-?\d)")  # ``(int)128``, ``(cub::BlockLoadAlgorithm)3``
_LAMBDA_NUMBER = re.compile(r"#\d+|\(instance \d+\)")
_QUALIFIER = re.compile(r"\b[A-Za-z_$][\w$]*::")
_WORD = re.compile(r"[A-Za-z_$][\w$]*|-?\d+(?=[uUlL]*\b)")
_PLACEHOLDER = re.compile(r"T\d*")
_IDENTIFIER = re.compile(r"[A-Za-z_$][\w$.]*")
_LITERAL = re.compile(r"L[a-z](n?)(\d+)E")  # a mangled template argument's value: ``Li128E``, ``Lb1E``
_MANGLED_SKIP = re.compile(r"S[0-9A-Z]*_|S[a-z]|T\d*_|DF\d+[a-z_]?|Dv\d+_|A\d+_")  # substitutions, types


@dataclass(frozen=True)
class Parts:
    """A name read for its short form: ``own`` the function's own name, ``scope`` its namespaces that say
    something (``cublasLt``; empty where none does), ``words`` what tells it from namesakes (its template
    arguments' and parameters' words, or a plain name's segments)."""

    own: str
    scope: str
    words: tuple[str, ...]


def short_names(names: Iterable[str | None]) -> dict[str, str]:
    """Each full name of one table -> its short name, distinct where the full names differ (None is left out:
    a kernel the trace did not name)."""
    full = list(dict.fromkeys(n for n in names if n is not None))
    parts = {n: parts_of(n) for n in full}
    namesakes: dict[str, list[str]] = {}
    for n in full:
        namesakes.setdefault(_fit(parts[n].own, WIDTH), []).append(n)
    chosen: dict[str, tuple[str, str, str]] = {}
    for base, group in namesakes.items():
        if len(group) == 1:
            chosen[group[0]] = ("", base, "")
            continue
        lists = {n: (parts[n].scope, *parts[n].words) for n in group}
        for n, at in _differences(lists).items():
            chosen[n] = _tagged(parts[n], lists[n], at)
    return _numbered(full, chosen)


def short_name(name: str) -> str:
    """One name's short form, with no table to be told apart in."""
    return short_names([name])[name]


def parts_of(name: str) -> Parts:
    """A kernel's name read as a mangled C++ name, a demangled signature or a plain name."""
    text = name.strip()
    if text.startswith("_Z"):
        mangled = _mangled(text)
        if mangled is not None:
            return mangled
    signature = _signature(text)
    if signature is not None:
        return signature
    return Parts(_plain(text), "", tuple(w for w in re.split(r"[\W_]+", text) if w))


def _plain(text: str) -> str:
    """A name that is no C++ signature, its brackets written square (``Memcpy HtoD [Pageable -> Device]``)."""
    return text.translate(str.maketrans("(<)", "[‹]")).replace(">", "›").replace("-›", "->")


# --------------------------------------------------------------------------- demangled signatures


def _signature(text: str) -> Parts | None:
    """A demangled C++ name (``void ns::f<T>(int)``, ``ns::f``, ``f(int)``); None for a plain name."""
    text = _ANONYMOUS.sub("", text).replace("operator ()", "operator()").replace(") const::", ")::")
    call = _call(text)
    head, params = call if call else (text, "")
    if call is None and "::" not in text and "<" not in text:
        return None
    pieces = _split_top(head.strip(), " ")
    scopes = [s for s in _split_top(pieces[-1], "::") if s]
    named = [i for i, s in enumerate(scopes) if _named(s)]
    if not named:
        return None
    own_at = named[-1]
    own, targs = _bare(scopes[own_at]), _template_arguments(scopes[own_at])
    outer = [_bare(s) for s in scopes[:own_at] if _named(s)]
    if own in GENERIC:
        own = _type_argument(targs) or "::".join([*outer[-1:], own])
    scope = "::".join(s for s in outer if s not in QUIET)
    return Parts(own, scope, tuple(_words(targs) + _words(params)))


def _call(text: str) -> tuple[str, str] | None:
    """(what comes before, what is inside) of a name's closing parameter list: ``f<T>(int) const`` ->
    (``f<T>``, ``int``); None where the name ends in none, or in a remark (``Memcpy HtoD (Pageable)``)."""
    body = _TRAILING.sub("", text)
    if not body.endswith(")"):
        return None
    depth = 0
    for i in range(len(body) - 1, -1, -1):
        depth += (body[i] == ")") - (body[i] == "(")
        if depth == 0:
            head = body[:i]
            return None if not head.strip() or head[-1].isspace() else (head, body[i + 1:-1])
    return None


def _split_top(text: str, sep: str) -> list[str]:
    """``text`` split at each ``sep`` outside every bracket (an arrow's ``>`` closes none)."""
    parts, depth, last, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c in "<([{":
            depth += 1
        elif c in ">)]}" and not (c == ">" and text[i - 1:i] == "-"):
            depth = max(depth - 1, 0)
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[last:i])
            i += len(sep)
            last = i
            continue
        i += 1
    return [*parts, text[last:]]


def _bare(scope: str) -> str:
    """A scope without its bracketed lists: ``elementwise_kernel<128, 2>`` -> ``elementwise_kernel``."""
    out, depth = [], 0
    for i, c in enumerate(scope):
        if c in "<([{":
            depth += 1
        elif c in ">)]}" and not (c == ">" and scope[i - 1:i] == "-"):
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(c)
    return "".join(out).strip()


def _named(scope: str) -> bool:
    """Whether a scope names something: not a lambda (``{lambda()#1}``) nor an operator (``operator()``)."""
    bare = _bare(scope)
    return bool(bare) and _IDENTIFIER.fullmatch(bare) is not None and not bare.startswith("operator")


def _template_arguments(scope: str) -> str:
    """What the first ``<`` of ``scope`` holds (``""`` where it has none)."""
    start = scope.find("<")
    return "" if start < 0 else _closed(scope[start + 1:])


def _closed(text: str) -> str:
    """``text`` up to the ``>`` that closes the ``<`` before it."""
    depth = 0
    for i, c in enumerate(text):
        if c in "<([{":
            depth += 1
        elif c in ")]}" or (c == ">" and text[i - 1:i] != "-"):
            if depth == 0:
                return text[:i]
            depth -= 1
    return text


def _type_argument(targs: str) -> str | None:
    """The own name of the first template argument after any numbers, where it names a type (not a
    builtin): ``cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4``, ``ReduceSplitK``."""
    for arg in _split_top(targs, ","):
        arg = _CAST.sub("", arg.strip())
        if re.fullmatch(r"-?\d+\w*", arg):
            continue
        scopes = [s for s in _split_top(_split_top(arg, " ")[-1], "::") if s and _named(s)]
        own = _bare(scopes[-1]) if scopes else ""
        return own if own and own not in BUILTIN and own not in GENERIC else None
    return None


def _words(text: str) -> list[str]:
    """The words of template arguments or parameters that can tell two names apart: each type's and
    function's own name, numbers (``2ul`` as ``2``), a lambda's parameter types; without namespaces,
    casts, lambda numbers and the parameters of the function a lambda is in."""
    text = _LAMBDA_NUMBER.sub("", text)
    text = _CAST.sub("", text)
    text = _enclosing_parameters(text)
    previous = None
    while previous != text:
        previous, text = text, _QUALIFIER.sub("", text)
    return [w for w in _WORD.findall(text) if w not in FILLER and not _PLACEHOLDER.fullmatch(w)]


def _enclosing_parameters(text: str) -> str:
    """``f(at::TensorIterator&)::{lambda(float)}`` -> ``f()::{lambda(float)}``: a lambda's enclosing
    function's parameters repeat in every lambda of it."""
    closing = _closings(text)
    out, i = [], 0
    while (start := text.find("(", i)) >= 0:
        end = closing.get(start)
        if end is None:
            break
        out.append(text[i:start + 1])
        encloses = text.startswith("::", end + 1) or text.startswith(" const::", end + 1)
        i = end if encloses else start + 1  # past an enclosing function's parameters, else into the group
    out.append(text[i:])
    return "".join(out)


def _closings(text: str) -> dict[int, int]:
    """Each ``(`` of ``text`` -> the ``)`` that closes it (an unclosed one is left out)."""
    found, opened = {}, []
    for i, c in enumerate(text):
        if c == "(":
            opened.append(i)
        elif c == ")" and opened:
            found[opened.pop()] = i
    return found


# --------------------------------------------------------------------------- mangled names


def _mangled(text: str) -> Parts | None:
    """An Itanium-mangled name (``_ZN5aiter24add_rmsnorm_quant_kernelIDF16b...``): its nested name's last
    part, the parts before it, and the names and values of what follows (template arguments, parameters)."""
    i = 3 if text.startswith("_ZL") else 2
    names, i = _nested(text, i)
    if not names:
        return None
    own, outer = names[-1], names[:-1]
    rest = text[i:]
    if own in GENERIC and rest.startswith("I"):
        inner, _ = _nested(rest, 1 + _literals_end(rest, 1))
        own = inner[-1] if inner else own
    scope = "::".join(s for s in outer if s not in QUIET)
    return Parts(own, scope, tuple(_mangled_words(rest)))


def _nested(text: str, i: int) -> tuple[list[str], int]:
    """The source names of the (nested) name at ``i`` (``N5aiter6kernelE``, or one ``6kernel``), and where
    it ends."""
    names: list[str] = []
    nested = text.startswith("N", i)
    if nested:
        i += 1
        while i < len(text) and text[i] in "rVKRO":
            i += 1
    while i < len(text):
        if text[i].isdigit():
            name, i = _source_name(text, i)
            if name is None:
                break
            names.append(name)
            if not nested:
                break
        elif (skip := _MANGLED_SKIP.match(text, i)) is not None:
            i = skip.end()
        else:
            break
    return names, i


def _literals_end(text: str, i: int) -> int:
    """How many characters of literals (``Li2E``) start at ``i``."""
    start = i
    while (literal := _LITERAL.match(text, i)) is not None:
        i = literal.end()
    return i - start


def _source_name(text: str, i: int) -> tuple[str | None, int]:
    """The length-prefixed identifier at ``i`` (``24add_rmsnorm_quant_kernel``) and where it ends."""
    digits = re.match(r"\d+", text[i:])
    size = int(digits.group())
    start = i + len(digits.group())
    name = text[start:start + size]
    if len(name) < size or not _IDENTIFIER.fullmatch(name):
        return None, i
    return name, start + size


def _mangled_words(text: str) -> list[str]:
    """The identifiers and literal values in the rest of a mangled name, in order."""
    words, i = [], 0
    while i < len(text):
        if (literal := _LITERAL.match(text, i)) is not None:
            words.append(("-" if literal.group(1) else "") + literal.group(2))
            i = literal.end()
        elif (skip := _MANGLED_SKIP.match(text, i)) is not None:
            i = skip.end()
        elif text[i].isdigit():
            name, end = _source_name(text, i)
            if name is not None:
                words.append(name)
            i = end if name is not None else i + 1
        else:
            i += 1
    return words


# --------------------------------------------------------------------------- telling namesakes apart


def _differences(lists: dict[str, tuple[str, ...]]) -> dict[str, list[int]]:
    """Per name, the positions of its words where it parts from other names of ``lists`` and goes its own
    way: where most names at that point go one way, theirs is the usual way and goes unsaid (a trie of
    the word lists; the depths on a name's path where it branches off the majority)."""
    end = object()
    passing: dict[int, dict[object, int]] = {}
    ids: dict[tuple[int, object], int] = {}
    paths: dict[str, list[tuple[int, object]]] = {}
    for name, words in lists.items():
        node, path = 0, []
        for word in (*words, end):
            path.append((node, word))
            branches = passing.setdefault(node, {})
            branches[word] = branches.get(word, 0) + 1
            node = ids.setdefault((node, word), len(ids) + 1)
        paths[name] = path
    return {name: [depth for depth, (node, word) in enumerate(path) if _parts_here(passing[node], word)]
            for name, path in paths.items()}


def _parts_here(branches: dict[object, int], word: object) -> bool:
    """Whether a name going ``word``'s way at a point where names go ``branches``' ways must say so: names
    part there, and not most of them go that way."""
    return len(branches) > 1 and 2 * branches[word] <= sum(branches.values())


def _tagged(parts: Parts, words: tuple[str, ...], at: list[int]) -> tuple[str, str, str]:
    """(scope, own name, tag) of a name among namesakes: the scope where they part at their scopes, the
    words where they part after (``[CUDAFunctor_add]``)."""
    scope = _fit(parts.scope, SCOPE_WIDTH) + "::" if 0 in at and parts.scope else ""
    shown = [words[i] for i in at if 0 < i < len(words)][:TAG_WORDS]
    tag = f"[{_fit(', '.join(shown), TAG_WIDTH - 2)}]" if shown else ""
    return scope, parts.own, tag


def _numbered(full: list[str], chosen: dict[str, tuple[str, str, str]]) -> dict[str, str]:
    """Each name's short form within ``WIDTH``, numbered (``#2``, in the order given) where it still equals
    an earlier one's."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    last: dict[tuple[str, str, str], int] = {}  # the number each form was last given
    for name in full:
        form = chosen[name]
        n = last.get(form, 1)
        text = _joined(*form, f"#{n}" if n > 1 else "")
        while text in taken:
            n += 1
            text = _joined(*form, f"#{n}")
        taken.add(text)
        last[form] = n
        out[name] = text
    return out


def _joined(scope: str, own: str, tag: str, number: str) -> str:
    """``scope`` + ``own`` + ``tag`` + ``number``, the own name cut to fit ``WIDTH``."""
    return scope + _fit(own, WIDTH - len(scope) - len(tag) - len(number)) + tag + number


def _fit(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, its end cut (a long plain name says what it is first:
    ``Cijk_Alik_Bljk_..._MT128x256x32_...``; namesakes cut alike are then told apart by their words)."""
    return text if len(text) <= width else text[:max(width - 1, 0)] + "…"
