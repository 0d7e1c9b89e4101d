"""Which skills the model is offered: all of them while they fit one request, else a choice —
the system skills, the ones kept for this conversation, then the best of a BM25 ranker over each skill's name, title, description and
parameter descriptions (stdlib only).

Tokens: English (and other Latin-script) text by words, lower-cased, with a light suffix
stripping so that "lights"/"light" and "turned"/"turn" meet; names split at `_`. Chinese (CJK)
text by character bigrams plus single characters, since it has no spaces and a two-character
word is the common unit. Not handled: synonyms, other scripts' segmentation, spelling mistakes.
"""
from __future__ import annotations

import heapq
import json
import math
import re
from collections import Counter
from collections.abc import Sequence

_WORD = re.compile(r"[a-z0-9]+|[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_CJK_START = "\u3400"
# Words so common in requests and descriptions that they only blur the ranking.
_STOP = frozenset("a an and are as at be by can do for from get i in into is it me my of or please "
                  "show the this to what with you your".split())
K1, B = 1.2, 0.75
NAME_WEIGHT = 2                         # a term of a name or title counts as often as this


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[:-len(suffix)]
    return word


def tokens(text: str) -> list[str]:
    """The terms of `text`: stemmed words, CJK bigrams and characters."""
    out: list[str] = []
    for run in _WORD.findall(text.lower().replace("_", " ")):
        if run[0] >= _CJK_START:
            out.extend(run)
            out.extend(run[i:i + 2] for i in range(len(run) - 1))
        elif run not in _STOP:
            out.append(_stem(run))
    return out


def skill_text(skill) -> tuple[str, str]:
    """What the ranker reads of a skill: (name and title, description and parameter texts)."""
    parts = [skill.description]
    stack = [skill.parameters]
    while stack:                    # every title/description/enum string in the schema
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("title", "description") and isinstance(value, str):
                    parts.append(value)
                elif key == "enum" and isinstance(value, list):
                    parts.extend(v for v in value if isinstance(v, str))
                elif isinstance(value, (dict, list)):
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
    return f"{skill.name} {skill.title}", " ".join(parts)


class Ranker:
    """BM25 over documents added and removed by key, best first; ties go to the smaller key.

    The skill catalog builds one per registry generation; memory.py keeps one per user and updates it on
    every write, so neither re-reads its documents per query.
    """

    def __init__(self) -> None:
        self._lengths: dict = {}                    # key -> the document's length in terms
        self._terms: dict = {}                      # key -> the document's distinct terms
        self._postings: dict[str, dict] = {}        # term -> {key: count}
        self._total = 0                             # sum of the lengths
        self._norms: dict | None = None             # key -> BM25's length normalisation; None: to compute

    def __len__(self) -> int:
        return len(self._lengths)

    def add(self, key, terms: Counter) -> None:
        """Index the document `key` as its `terms` (replacing what `key` had)."""
        self.remove(key)
        self._lengths[key] = length = sum(terms.values())
        self._total += length
        self._terms[key] = tuple(terms)
        for term, count in terms.items():
            self._postings.setdefault(term, {})[key] = count
        self._norms = None

    def remove(self, key) -> None:
        """Forget the document `key` (nothing if it was not there)."""
        length = self._lengths.pop(key, None)
        if length is None:
            return
        self._total -= length
        for term in self._terms.pop(key):
            postings = self._postings[term]
            del postings[key]
            if not postings:
                del self._postings[term]
        self._norms = None

    def search(self, query: str, limit: int) -> list:
        """Up to `limit` keys best matching `query`, best first; only documents sharing a term."""
        if limit <= 0 or not self._lengths:
            return []
        if self._norms is None:
            average = self._total / len(self._lengths) or 1.0
            self._norms = {key: K1 * (1 - B + B * length / average) for key, length in self._lengths.items()}
        norms = self._norms
        scores: dict = {}
        total = len(self._lengths)
        for term, weight in Counter(tokens(query)).items():
            postings = self._postings.get(term)
            if not postings:
                continue
            factor = weight * math.log(1 + (total - len(postings) + 0.5) / (len(postings) + 0.5)) * (K1 + 1)
            for key, count in postings.items():
                scores[key] = scores.get(key, 0.0) + factor * count / (count + norms[key])
        return heapq.nsmallest(limit, scores, key=lambda k: (-scores[k], k))


class Index(Ranker):
    """BM25 over a fixed set of skills, keyed by name; build once per registry generation."""

    def __init__(self, skills):
        super().__init__()
        for skill in skills:
            head, body = skill_text(skill)
            terms = Counter(tokens(body))
            for term in tokens(head):
                terms[term] += NAME_WEIGHT
            self.add(skill.name, terms)


def tool_spec(skill) -> dict:
    """A skill as an OpenAI function tool."""
    return {"type": "function",
            "function": {"name": skill.name, "description": skill.description,
                         # an MCP tool: the schema its server announced (iAs validates a relaxed copy)
                         "parameters": untitled(skill.mcp.schema if skill.mcp is not None else skill.parameters)}}


_SUBSCHEMA = ("items", "not", "additionalProperties")
_SUBSCHEMAS = ("anyOf", "oneOf", "allOf")


def untitled(schema):
    """`schema` without its `title` keywords: a title labels a parameter in the owner's confirmation message
    and tells the model nothing its name and description do not, while every byte of a tool is paid for on
    every request. Only the keyword goes: a property that is named `title` stays."""
    if not isinstance(schema, dict):
        return schema
    out = {key: value for key, value in schema.items() if key != "title"}
    if isinstance(out.get("properties"), dict):
        out["properties"] = {name: untitled(sub) for name, sub in out["properties"].items()}
    for key in _SUBSCHEMA:
        if key in out:
            out[key] = untitled(out[key])
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), list):
            out[key] = [untitled(sub) for sub in out[key]]
    return out


def spec_size(spec: dict) -> int:
    """Bytes of one tool definition in a request body (compact JSON, as the SDK sends it)."""
    return len(json.dumps(spec, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


class Catalog:
    """The registry's skills as tools, and the choice of the ones offered per model request.

    The index and the tool definitions are rebuilt when the registry's generation changes (a
    reload that changed something), so a hot-reloaded skill is ranked and offered at once.
    """

    def __init__(self, registry, max_tools: int, tools_bytes: int):
        self.registry = registry
        self.max_tools = max_tools
        self.tools_bytes = tools_bytes
        self._generation = -1
        self._index: Index | None = None
        self._specs: dict[str, tuple[dict, int]] = {}

    def _fresh(self) -> None:
        if self._generation != self.registry.generation:
            self._specs = {}
            for skill in self.registry:
                spec = tool_spec(skill)
                self._specs[skill.name] = (spec, spec_size(spec))
            self._index = None
            self._generation = self.registry.generation

    def index(self) -> Index:
        self._fresh()
        if self._index is None:
            self._index = Index(self.registry)
        return self._index

    def search(self, query: str, limit: int) -> list[str]:
        """The `limit` skills best matching `query` (find_skills)."""
        return self.index().search(query, limit)

    def totals(self) -> tuple[int, int]:
        """(tools, bytes) of offering every loaded skill."""
        self._fresh()
        return len(self._specs), sum(size for _, size in self._specs.values())

    def fits(self) -> bool:
        """Whether every loaded skill fits one request."""
        count, size = self.totals()
        return count <= self.max_tools and size <= self.tools_bytes

    def select(self, query: str, keep: Sequence[str] = ()) -> list[dict]:
        """The tools for one request: all while they fit; else the system skills, `keep` (skills used
        or found in this conversation, most important first), then the user skills ranked for `query`."""
        self._fresh()
        if self.fits():
            return [spec for spec, _ in self._specs.values()]
        chosen: dict[str, dict] = {}
        used = 0

        def offer(name: str, always: bool = False) -> None:
            nonlocal used
            entry = self._specs.get(name)
            if entry is None or name in chosen or len(chosen) >= self.max_tools:
                return
            if always or used + entry[1] <= self.tools_bytes:
                chosen[name] = entry[0]
                used += entry[1]
        for skill in self.registry:
            if skill.source == "system":
                offer(skill.name, always=True)
        for name in keep:
            offer(name)
        for name in self.index().search(query, self.max_tools * 2):
            if len(chosen) >= self.max_tools:
                break
            offer(name)
        return list(chosen.values())
