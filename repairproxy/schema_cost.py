"""What a client's JSON schema costs the event loop, bounded before it is compiled.

jsonschema-rs holds the GIL, so a schema's compile and an answer's check run on the loop whatever
thread calls them. The bytes bound neither: the regular expressions, the JSON nodes and the
``$ref`` fan-out do. This module holds the one way a client-declared schema is compiled
(``schema_validator``) and the counts the caches check against the request's caps
(``schema_patterns``, ``schema_nodes``, ``schema_fanout``); ``validation`` and ``structured``
apply them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

import jsonschema_rs

__all__ = [
    "DEFAULT_MAX_SCHEMA_NODES",
    "DEFAULT_MAX_SCHEMA_PATTERNS",
    "MAX_SCHEMA_FANOUT",
    "PATTERN_OPTIONS",
    "SchemaFanoutError",
    "schema_fanout",
    "schema_fanout_from_bytes",
    "schema_nodes",
    "schema_patterns",
    "schema_validator",
]

# Patterns run in fancy-regex with bounded backtracking and a bounded program: a pattern whose
# compiled size passes the limit (``(\w{100}){30}``) is refused as an invalid schema (400)
# instead of costing seconds of matching; one near the limit matches 3,000 characters in
# ~10 ms.
PATTERN_OPTIONS = jsonschema_rs.FancyRegexOptions(
    backtrack_limit=10_000, size_limit=256 * 1024, dfa_size_limit=256 * 1024
)
# The bytes do not bound the compile. A pattern near that size limit (``(\w{100}){27}``, 14
# bytes) takes ~1.5-3 ms to compile, where an everyday one takes ~0.05 ms: 256 KiB of them took
# 8-20 s. And every JSON object costs ~1-4 us: 256 KiB of ``{}`` took ~100 ms. Hence two caps
# per request (its tools and response_format together). At these, ``python -m benchmarks.limits``
# measured the worst accepted request (16 such patterns beside 8,000 properties) at ~40 ms to
# compile on the 2-core dev machine; real tool lists take ~35-50 bytes of JSON per node (the
# retail tools: 1.7 KB, 35 nodes), so 8,192 admits any that fits the byte cap.
DEFAULT_MAX_SCHEMA_PATTERNS = 16
DEFAULT_MAX_SCHEMA_NODES = 8 * 1024
# Nor do they bound the check: a $ref lets a small schema check one value of an answer against
# one subschema many times (an allOf naming the next level twice doubles it per level: ~20 ms
# at 20 levels, ~0.5 s at 24 for the answer ``1``; building an invalid answer's errors, ~2 s at
# 16). Hence a cap on the work of checking one value (``schema_fanout``), per schema (each tool,
# the response_format). At 1,024, ``python -m benchmarks.limits`` measured the worst accepted
# fan-out at <0.05 ms to check a valid answer and 2-5 ms an invalid one (jsonschema-rs builds
# every error, ~5 us each) on the 2-core dev machine; real schemas take 3-25 (tau2's tools at
# most 15, pydantic models with $defs 6-23).
MAX_SCHEMA_FANOUT = 1024


def schema_validator(schema: Mapping[str, Any]) -> jsonschema_rs.Validator:
    """A client-declared JSON Schema compiled the one way the proxy compiles them (a tool's
    parameters, a ``response_format``): offline, so a remote ``$ref`` never makes the proxy fetch
    a URL, and with ``PATTERN_OPTIONS``, so matching a declared pattern is bounded (backtracking
    and program size). Raises what ``jsonschema_rs.validator_for`` raises for an invalid schema."""
    return jsonschema_rs.validator_for(dict(schema), offline=True, pattern_options=PATTERN_OPTIONS)


def schema_nodes(key: bytes) -> int:
    """The JSON objects and arrays in serialised JSON, counted by their opening brackets: those
    inside strings count too, so it is an upper bound, and it costs no walk."""
    return key.count(b"{") + key.count(b"[")


def schema_patterns(schema: Any) -> set[str]:
    """The distinct regular expressions compiling ``schema`` compiles (jsonschema-rs compiles one
    pattern once per schema): every string under a ``pattern`` key and every key of a
    ``patternProperties`` object, wherever it is, since a ``$ref`` can point anywhere (a pattern
    under ``examples`` counts too: an upper bound)."""
    found: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            pattern = node.get("pattern")
            if isinstance(pattern, str):
                found.add(pattern)
            keyed = node.get("patternProperties")
            if isinstance(keyed, dict):
                found.update(key for key in keyed if isinstance(key, str))
            stack.extend(value for value in node.values() if isinstance(value, dict | list))
        elif isinstance(node, list):
            stack.extend(value for value in node if isinstance(value, dict | list))
    return found


def schema_fanout_from_bytes(key: bytes) -> int | None:
    """An upper bound of ``schema_fanout`` for any schema in serialised JSON, read without a
    walk; None when the JSON may name a reference (a key ending in "ef": ``$ref``,
    ``$dynamicRef``, ``$recursiveRef``). Without one, a schema checks a value against each of its
    subschemas at most once, and ``_weight`` counts each JSON value at most twice (as a
    subschema, and as an entry of ``properties``), so twice the JSON values (at most one more
    than the commas and brackets) bound it, with one to spare for ``_closed``'s."""
    if b'ef":' in key:
        return None
    return 2 * (2 + key.count(b",") + schema_nodes(key))


# -- how many times one value of an answer can be checked ----------------------------------------

# Keywords whose subschemas check the same value as the schema holding them, and references.
_SAME_VALUE = frozenset(
    ("allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "dependencies")
)
_REFERENCES = frozenset(("$ref", "$dynamicRef", "$recursiveRef"))
# Keywords whose subschemas check the value's members (properties, items, property names).
_MEMBERS = frozenset(
    (
        "properties",
        "patternProperties",
        "additionalProperties",
        "unevaluatedProperties",
        "propertyNames",
        "prefixItems",
        "items",
        "additionalItems",
        "contains",
        "unevaluatedItems",
    )
)
_APPLYING = _SAME_VALUE | _REFERENCES | _MEMBERS
# A subschema with only these is its $ref's target (pydantic writes a field's description there).
_REFERENCE_ONLY = frozenset(
    ("$ref", "$comment", "title", "description", "default", "examples", "deprecated")
)
# Keywords that compare the value with names or values the schema lists: weighed by those.
_COMPARED = frozenset(("required", "dependentRequired", "enum", "const"))
_KEYWORDS = _APPLYING | _COMPARED
# Where $id and anchors can be (a $ref reaches $defs too), and which of those map names to them.
_SUBSCHEMA_MAPS = frozenset(
    ("properties", "patternProperties", "dependentSchemas", "dependencies", "$defs", "definitions")
)
_SUBSCHEMA_HOLDERS = _APPLYING | _SUBSCHEMA_MAPS
# The base URI of a schema without $id; .invalid names nothing a client's $id can.
_ROOT_URI = "https://repairproxy.invalid/schema.json"
# Merging per-member maps costs their sizes; past this many entries (a schema that shares wide
# subschemas at many places) maps merge collapsed to their largest entry: coarser, still a bound.
_MERGE_BUDGET = 8 * 1024

_Triple = tuple[int, int, int]
_ZERO: _Triple = (0, 0, 0)
_ZEROS = itertools.repeat(0)


class SchemaFanoutError(ValueError):
    """``schema_fanout`` refused a schema: over the limit (``bound``: at least that much), or
    with no bound (``bound`` None; ``reason`` says why, ``{values}`` standing for what the schema
    checks)."""

    def __init__(self, reason: str, bound: int | None = None) -> None:
        super().__init__(reason or f"at least {bound} checks of one value")
        self.reason = reason
        self.bound = bound

    def message(self, subject: str, values: str, limit: int) -> str:
        """The refusal as the client reads it: ``subject`` ("tool 'f'") checks ``values`` ("its
        arguments")."""
        if self.bound is not None:
            return (
                f"{subject} can check one value of {values} against at least {self.bound} "
                "subschemas, names and values (a subschema that a $ref or an applicator reaches "
                f"again counts again); at most {limit} are accepted per value (schema fan-out "
                "limit)"
            )
        return f"{subject} {self.reason.replace('{values}', values)} (schema fan-out limit)"


def schema_fanout(schema: Any, limit: int = MAX_SCHEMA_FANOUT) -> int:
    """An upper bound of the work of checking one value of an answer (one instance location)
    against ``schema``: the subschemas jsonschema-rs may check that value against, each
    weighted by the names and values it compares. Raises ``SchemaFanoutError`` past ``limit``,
    or where there is no bound.

    Why per value: checking an answer checks each of its values against some subschemas, so it
    costs at most this bound times the answer's values, and the answer's size bounds those.
    The bound is the schema's doing. Without a reference each subschema sits at one place and
    checks a value at most once; a ``$ref`` lets a small schema reach one subschema many times
    for one value, doubling with each level whose ``allOf`` names the next level twice (or
    ``oneOf``, ``not``, ``if``/``then``/``else``: when errors are collected every branch runs).

    The walk (linear: each subschema once, merges of wide per-member maps budgeted):
    - ``here(S)``, checks of the value S checks from one check of S: S's weight (one, one per
      ``properties``/``patternProperties`` entry it looks up, and ``_weight``'s names and values
      it compares) plus ``here`` of every subschema S applies to the same value, once per time it
      names it (``allOf``/``anyOf``/``oneOf`` entries, ``not``, ``if``/``then``/``else``,
      ``dependentSchemas``, the target of ``$ref``; ``$dynamicRef`` and ``$recursiveRef`` count
      every subschema they may land on). A subschema that is only a ``$ref`` (and annotations)
      is its target. A cycle of these never leaves the value: refused.
    - ``nested(S)``, at most the checks of any one value inside it. A member of the value (a
      property, an array position, a property name) is checked by what S and everything S
      applies to the same value apply to that member: ``properties`` by name, else
      ``additionalProperties``; every ``patternProperties`` entry (any may match);
      ``prefixItems``/``items``, ``additionalItems``, ``contains``, ``unevaluated*``. Those sum
      per member, their ``here`` at the member itself and their ``nested`` below it, and
      ``nested(S)`` is the largest over members: two properties are two values, so a ``left``
      and a ``right`` that both recurse cost no more than one.
    - A recursion through members (a tree's ``children: {items: {$ref}}``) makes ``nested``
      depend on itself: within a strongly connected part of the graph every ``nested`` is the
      same, and finite only if each member reaches back into the part at most once and beside
      nothing else that goes deeper, so each level of the answer costs what the one above did.
      Otherwise (the recursion reached twice for one member: a ``left`` in two branches of a
      ``oneOf``) the checks multiply with each level of the answer's nesting: refused.
    The bound is ``max(here(root), nested(root))``: sums of maxima, never an under-estimate.
    A reference outside the document is refused: offline, jsonschema-rs can only reach its
    bundled meta-schemas that way, and the walk cannot see into them.
    """
    if isinstance(schema, Mapping) and not isinstance(schema, dict):
        schema = dict(schema)  # as schema_validator compiles it
    return _FanoutWalk(schema, limit).run()


def _sum(a: _Triple, b: _Triple) -> _Triple:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def _difference(a: _Triple, b: _Triple) -> _Triple:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])


def _top(a: _Triple, b: _Triple) -> _Triple:
    return (max(a[0], b[0]), max(a[1], b[1]), max(a[2], b[2]))


def _without_loops(triple: _Triple, nested: int) -> _Triple:
    return (triple[0], triple[1] + triple[2] * nested, 0)


class _Members:
    """What one check of a value against a subschema (and everything that checks the same value
    with it) checks at each member of that value: at a property no entry names,
    ``property_default``; at one named, that plus ``property_delta[name]``; the same for array
    positions; ``key`` at a property name. Each a triple: checks of the member itself; at most
    of any one value nested in it; references back into the strongly connected part being
    solved (each worth that part's ``nested``, once known)."""

    __slots__ = ("item_default", "item_delta", "key", "peak", "property_default", "property_delta")

    def __init__(self) -> None:
        self.property_default = _ZERO
        self.property_delta: dict[str, _Triple] = {}
        self.item_default = _ZERO
        self.item_delta: dict[int, _Triple] = {}
        self.key = _ZERO
        self.peak: int | None = None  # the most checks it holds, known once it holds no loop

    def size(self) -> int:
        return len(self.property_delta) + len(self.item_delta)

    def each(self) -> Iterator[_Triple]:
        """Every member's triple: each named one, and any other of each kind."""
        yield self.property_default
        for delta in self.property_delta.values():
            yield _sum(self.property_default, delta)
        yield self.item_default
        for delta in self.item_delta.values():
            yield _sum(self.item_default, delta)
        yield self.key

    def add(self, other: _Members) -> None:
        self.property_default = _sum(self.property_default, other.property_default)
        self.item_default = _sum(self.item_default, other.item_default)
        self.key = _sum(self.key, other.key)
        for name, delta in other.property_delta.items():
            mine = self.property_delta.get(name)
            self.property_delta[name] = delta if mine is None else _sum(mine, delta)
        for position, delta in other.item_delta.items():
            found = self.item_delta.get(position)
            self.item_delta[position] = delta if found is None else _sum(found, delta)

    def collapsed(self) -> _Members:
        """One triple per kind of member, at least each member's: coarser, still a bound."""
        found = _Members()
        found.key = self.key
        found.property_default = properties = self.property_default
        for delta in self.property_delta.values():
            found.property_default = _top(found.property_default, _sum(properties, delta))
        found.item_default = items = self.item_default
        for delta in self.item_delta.values():
            found.item_default = _top(found.item_default, _sum(items, delta))
        return found

    def closed(self, nested: int) -> _Members:
        """Back references replaced by ``nested``, the bound they stood for."""
        found = _Members()
        found.property_default = _without_loops(self.property_default, nested)
        found.property_delta = {
            n: _without_loops(t, nested) for n, t in self.property_delta.items()
        }
        found.item_default = _without_loops(self.item_default, nested)
        found.item_delta = {p: _without_loops(t, nested) for p, t in self.item_delta.items()}
        found.key = _without_loops(self.key, nested)
        return found

    def most(self) -> int:
        """The most checks of any one member, or of any one value nested in one (no loops)."""
        if self.peak is None:
            found = max(*self.property_default[:2], *self.item_default[:2], *self.key[:2])
            for default, deltas in (
                (self.property_default, self.property_delta.values()),
                (self.item_default, self.item_delta.values()),
            ):
                if deltas:
                    found = max(
                        found,
                        default[0] + max(delta[0] for delta in deltas),
                        default[1] + max(delta[1] for delta in deltas),
                    )
            self.peak = found
        return self.peak


_NO_MEMBERS = _Members()
_NO_MEMBERS.peak = 0


def _weight(node: dict[str, Any]) -> int:
    """One, and one per name or JSON value ``node`` compares the value with (``required``,
    ``dependentRequired``, ``enum``, ``const``): a 20,000-name ``required`` takes ~1 ms to check
    on the 2-core dev machine, where a subschema takes ~15 ns."""
    weight = 1
    for keyword in ("enum", "const"):
        if keyword in node:
            value = node[keyword]
            weight += _json_values(value) if isinstance(value, dict | list) else 1
    required = node.get("required")
    if isinstance(required, list):
        weight += len(required)
    for keyword in ("dependentRequired", "dependencies"):  # draft 7's: its lists of names
        dependent = node.get(keyword)
        if isinstance(dependent, dict):
            weight += sum(len(names) for names in dependent.values() if isinstance(names, list))
    return weight


def _json_values(value: Any) -> int:
    """The JSON values in ``value``, itself included."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


class _Moves:
    """The subschemas of one schema that check members of its value, by member: a property it
    names, any other property, every property (patterns: any may match), and the same for array
    positions; a property name."""

    __slots__ = (
        "item_always",
        "item_default",
        "item_named",
        "key",
        "property_always",
        "property_default",
        "property_named",
    )

    def __init__(self) -> None:
        self.property_named: dict[str, int] = {}
        self.property_default: list[int] = []
        self.property_always: list[int] = []
        self.item_named: dict[int, list[int]] = {}
        self.item_default: list[int] = []
        self.item_always: list[int] = []
        self.key: list[int] = []

    def targets(self) -> list[int]:
        found = list(self.property_named.values())
        for targets in self.item_named.values():
            found.extend(targets)
        for targets in (
            self.property_default,
            self.property_always,
            self.item_default,
            self.item_always,
            self.key,
        ):
            found.extend(targets)
        return found


class _FanoutWalk:
    """One run of ``schema_fanout``: the schema's subschemas, numbered as a depth-first walk
    reaches them, and what it has found out about each (in lists indexed by number)."""

    def __init__(self, schema: Any, limit: int) -> None:
        self.limit = limit
        self.numbers: dict[int, int] = {}
        self.nodes: list[Any] = []
        self.bases: list[str] = []
        self.same: list[list[int]] = []
        self.moves: list[_Moves | None] = []
        self.successors: list[list[int]] = []
        self.here: list[int] = []
        self.nested: list[int] = []
        self.members: list[_Members] = []
        self.resources: dict[str, Any] = {_ROOT_URI: schema}
        self.resolved: dict[tuple[str, str], tuple[Any, str] | None] = {}
        self.indexed = False
        self.anchors: dict[tuple[str, str], tuple[Any, str]] = {}
        self.dynamic_anchors: dict[str, list[tuple[Any, str]]] = {}
        self.recursive_anchors: list[tuple[Any, str]] = []
        self.budget = _MERGE_BUDGET
        self.collapsed: dict[int, _Members] = {}
        # Subschemas that apply nothing (most of a schema) share one number per weight, solved
        # from the start.
        self.terminals: dict[int, int] = {}
        self.solved: list[int] = []
        self.visits = 0
        self.plain = self.terminals[1] = self.append(None, _ROOT_URI, 1)
        self.solved.append(self.plain)
        self.root = self.number(schema, _ROOT_URI)

    def number(self, node: Any, base: str) -> int:
        if not isinstance(node, dict) or _KEYWORDS.isdisjoint(node):
            return self.plain  # most of a schema: applies nothing, compares nothing
        found = self.numbers.get(id(node))
        if found is not None:
            return found
        if _APPLYING.isdisjoint(node):  # compares only: solved as it is, one number per weight
            weight = _weight(node)
            found = self.terminals.get(weight)
            if found is None:
                found = self.terminals[weight] = self.append(None, base, weight)
                self.solved.append(found)
        elif "$ref" in node and node.keys() <= _REFERENCE_ONLY:
            return self.number_reference(node, base)
        else:
            if isinstance(node.get("$id"), str):
                base = urldefrag(urljoin(base, node["$id"]))[0]
                self.resources.setdefault(base, node)
            found = self.append(node, base, 0)
        self.numbers[id(node)] = found
        return found

    def numbered(self, nodes: Iterable[Any], base: str) -> list[int]:
        """``number`` of each, the plain ones (most of a schema) told apart without a call."""
        plain, keywords, number = self.plain, _KEYWORDS, self.number
        return [
            plain
            if (type(node) is dict and keywords.isdisjoint(node)) or type(node) is bool
            else number(node, base)
            for node in nodes
        ]

    def number_reference(self, node: dict[str, Any], base: str) -> int:
        """A subschema that is only a ``$ref`` (and annotations) is its target: numbered as it
        is, following a chain of them without recursion."""
        chain: set[int] = set()
        while True:
            if id(node) in chain:
                raise SchemaFanoutError(
                    "has a cycle of references that never leaves one value of {values} "
                    f"($ref {node['$ref']!r})"
                )
            chain.add(id(node))
            reference = node["$ref"]
            if not isinstance(reference, str):
                found = self.plain  # not a schema jsonschema-rs compiles: it refuses it
                break
            node, base = self.targets("$ref", reference, base)[0]
            known = self.numbers.get(id(node))
            if known is not None:
                found = known
                break
            if not (isinstance(node, dict) and node.keys() <= _REFERENCE_ONLY and "$ref" in node):
                found = self.number(node, base)
                break
        for identity in chain:
            self.numbers[identity] = found
        return found

    def append(self, node: Any, base: str, here: int) -> int:
        self.nodes.append(node)
        self.bases.append(base)
        self.same.append([])
        self.moves.append(None)
        self.successors.append([])
        self.here.append(here)
        self.nested.append(0)
        self.members.append(_NO_MEMBERS)
        return len(self.nodes) - 1

    def expand(self, number: int) -> None:
        """Number what node ``number`` applies, and to what: the same value, or which members."""
        node, base, same = self.nodes[number], self.bases[number], self.same[number]
        moves = None if _MEMBERS.isdisjoint(node) else _Moves()
        weight = _weight(node)
        for keyword, value in node.items():
            if keyword not in _APPLYING:
                continue
            if keyword in ("allOf", "anyOf", "oneOf"):
                if isinstance(value, list):
                    same.extend(self.numbered(value, base))
            elif keyword in ("not", "if", "then", "else"):
                same.append(self.number(value, base))
            elif keyword in ("dependentSchemas", "dependencies"):
                if isinstance(value, dict):
                    for entry in value.values():
                        if isinstance(entry, dict | bool):  # else names: weighed as compared
                            same.append(self.number(entry, base))
            elif keyword in _REFERENCES:
                if isinstance(value, str):
                    same.extend(self.number(t, b) for t, b in self.targets(keyword, value, base))
            elif moves is not None:
                weight += self.add_move(moves, keyword, value, base)
        self.here[number] = weight
        if moves is not None:
            self.moves[number] = moves
            self.successors[number] = same + moves.targets()
        else:
            self.successors[number] = same

    def add_move(self, moves: _Moves, keyword: str, value: Any, base: str) -> int:
        """File what ``keyword`` applies to members in ``moves``; its weight: one per property
        it looks up or pattern it matches."""
        if keyword == "properties":
            if isinstance(value, dict):
                numbers = self.numbered(value.values(), base)
                moves.property_named = dict(zip(value, numbers, strict=True))
                return len(value)
        elif keyword == "patternProperties":
            if isinstance(value, dict):
                moves.property_always.extend(self.number(c, base) for c in value.values())
                return len(value)
        elif keyword == "prefixItems" or (keyword == "items" and isinstance(value, list)):
            if isinstance(value, list):
                for position, child in enumerate(value):
                    targets = moves.item_named.setdefault(position, [])
                    targets.append(self.number(child, base))
        else:
            target = self.number(value, base)
            if keyword == "additionalProperties":
                moves.property_default.append(target)
            elif keyword == "unevaluatedProperties":
                moves.property_always.append(target)
            elif keyword == "additionalItems":
                moves.item_default.append(target)
            elif keyword == "propertyNames":
                moves.key.append(target)
            else:  # items (one schema for every position), contains, unevaluatedItems
                moves.item_always.append(target)
        return 0

    def targets(self, keyword: str, reference: str, base: str) -> list[tuple[Any, str]]:
        """What a reference can land on, with each one's base URI."""
        key = (reference, base)
        if key not in self.resolved:
            self.resolved[key] = self.resolve(reference, base)
        found = self.resolved[key]
        if found is None:
            raise SchemaFanoutError(
                f"has a {keyword} the proxy cannot follow within the schema ({reference!r}), "
                "so it cannot bound how often one value of {values} is checked"
            )
        if keyword == "$dynamicRef":  # may land on any subschema naming its anchor: count all
            self.index()
            return [found, *self.dynamic_anchors.get(urldefrag(reference)[1], ())]
        if keyword == "$recursiveRef":
            self.index()
            return [found, *self.recursive_anchors]
        return [found]

    def resolve(self, reference: str, base: str) -> tuple[Any, str] | None:
        """The subschema a reference names within the document, and its base URI; else None."""
        if reference.startswith("#"):  # the common case, and one urljoin gets wrong for urn:
            uri, fragment = base, reference[1:]
        else:
            uri, fragment = urldefrag(urljoin(base, reference))
        if uri not in self.resources:
            self.index()
        node = self.resources.get(uri)
        if "%" in fragment:
            fragment = unquote(fragment)
        if node is None or not fragment:
            return None if node is None else (node, uri)
        if fragment[0] != "/":
            self.index()
            return self.anchors.get((uri, fragment))
        for token in fragment[1:].split("/"):
            if "~" in token:
                token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict):
                if token not in node:
                    return None
                node = node[token]
                if isinstance(node, dict) and "$id" in node and isinstance(node["$id"], str):
                    uri = urldefrag(urljoin(uri, node["$id"]))[0]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                return None
        return (node, uri) if isinstance(node, dict | bool) else None

    def index(self) -> None:
        """Find the document's $id, $anchor, $dynamicAnchor and $recursiveAnchor, once."""
        if self.indexed:
            return
        self.indexed = True
        stack = [(self.resources[_ROOT_URI], _ROOT_URI)]
        while stack:
            node, base = stack.pop()
            if not isinstance(node, dict):
                continue
            if isinstance(node.get("$id"), str):
                base = urldefrag(urljoin(base, node["$id"]))[0]
                self.resources.setdefault(base, node)
            for keyword in ("$anchor", "$dynamicAnchor"):
                name = node.get(keyword)
                if isinstance(name, str):
                    self.anchors[(base, name)] = (node, base)
                    if keyword == "$dynamicAnchor":
                        self.dynamic_anchors.setdefault(name, []).append((node, base))
            if node.get("$recursiveAnchor") is True:
                self.recursive_anchors.append((node, base))
            for keyword in _SUBSCHEMA_HOLDERS.intersection(node):
                value = node[keyword]
                if isinstance(value, list):
                    stack.extend((child, base) for child in value)
                elif isinstance(value, dict) and keyword in _SUBSCHEMA_MAPS:
                    stack.extend((child, base) for child in value.values())
                else:
                    stack.append((value, base))

    def run(self) -> int:
        """Tarjan's algorithm without recursion, over the subschemas and what they apply: each
        strongly connected part is solved once every part it reaches is."""
        index: list[int] = []  # by number: when the walk reached it; -1: not yet
        low: list[int] = []
        on_stack: set[int] = set()
        stack: list[int] = []
        work: list[tuple[int, int]] = []

        def visit(number: int) -> None:
            self.expand(number)
            missing = len(self.nodes) - len(index)
            index.extend([-1] * missing)
            low.extend([-1] * missing)
            for solved in self.solved:  # terminals are reached, not visited
                index[solved] = low[solved] = 0
            self.solved.clear()
            self.visits += 1
            index[number] = low[number] = self.visits
            stack.append(number)
            on_stack.add(number)
            work.append((number, 0))

        if self.nodes[self.root] is None:  # a schema that applies nothing
            return self.over(self.here[self.root])
        visit(self.root)
        while work:
            number, position = work[-1]
            successors = self.successors[number]
            while position < len(successors):
                target = successors[position]
                position += 1
                if index[target] < 0:
                    work[-1] = (number, position)
                    visit(target)
                    break
                if target in on_stack and index[target] < low[number]:
                    low[number] = index[target]
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[number])
                if low[number] == index[number]:
                    member = stack.pop()
                    on_stack.discard(member)
                    if member == number and number not in successors:
                        self.solve_one(number)
                        continue
                    part = [member]
                    while member != number:
                        member = stack.pop()
                        on_stack.discard(member)
                        part.append(member)
                    self.solve_part(part)
        return max(self.here[self.root], self.nested[self.root])

    def over(self, count: int) -> int:
        if count > self.limit:
            raise SchemaFanoutError("", count)
        return count

    def solve_one(self, number: int) -> None:
        """A subschema on no cycle: everything it applies is solved."""
        here = self.here
        here[number] = self.over(here[number] + sum(map(here.__getitem__, self.same[number])))
        members = self.members[number] = self.members_of(number, None)
        self.nested[number] = self.over(members.most())

    def solve_part(self, part: list[int]) -> None:
        """A strongly connected part: a recursion through members, or a cycle that never leaves
        one value (refused)."""
        inside = set(part)
        here = self.here
        ordered = self.same_value_order(part, inside)
        for number in ordered:
            here[number] = self.over(here[number] + sum(map(here.__getitem__, self.same[number])))
        for number in ordered:  # once every ``here`` of the part is known
            self.members[number] = self.members_of(number, inside)
        nested, loops = 0, False
        for members in {id(self.members[n]): self.members[n] for n in part}.values():
            if members.peak is not None:
                nested = max(nested, members.peak)
                continue
            for at_member, below, back in members.each():
                nested = max(nested, at_member, below)
                if back:
                    if back > 1 or below > 0:
                        raise SchemaFanoutError(
                            "has a recursion that checks one value of {values} more times the "
                            "deeper the value nests (a recursive subschema reached twice for "
                            "one member of a value, or beside another that goes deeper)"
                        )
                    loops = True
        self.over(nested)
        closed: dict[int, _Members] = {}
        for number in part:
            self.nested[number] = nested
            if loops:
                members = self.members[number]
                if id(members) not in closed:
                    closed[id(members)] = members.closed(nested)
                self.members[number] = closed[id(members)]

    def same_value_order(self, part: list[int], inside: set[int]) -> list[int]:
        """The part's subschemas, each after those it applies to the same value; a cycle of
        these never leaves one value: refused."""
        done: set[int] = set()
        order: list[int] = []
        for start in part:
            if start in done:
                continue
            open_nodes = {start}
            path = [(start, iter(self.same[start]))]
            while path:
                number, children = path[-1]
                for child in children:
                    if child not in inside or child in done:
                        continue
                    if child in open_nodes:
                        raise SchemaFanoutError(
                            "has a cycle of references that never leaves one value of {values} "
                            f"({self.reference_on([n for n, _ in path])})"
                        )
                    open_nodes.add(child)
                    path.append((child, iter(self.same[child])))
                    break
                else:
                    path.pop()
                    open_nodes.discard(number)
                    done.add(number)
                    order.append(number)
        return order

    def reference_on(self, path: list[int]) -> str:
        for number in reversed(path):
            node = self.nodes[number]
            for keyword in ("$ref", "$dynamicRef", "$recursiveRef"):
                if isinstance(node.get(keyword), str):
                    return f"{keyword} {node[keyword]!r}"
        return "through its applicators"

    def members_of(self, number: int, inside: set[int] | None) -> _Members:
        """What one check of node ``number`` checks at each member of the value; references
        into ``inside``, the part being solved, are counted as such."""
        moves, same = self.moves[number], self.same[number]
        if moves is None:
            if not same:
                return _NO_MEMBERS
            if len(same) == 1:
                return self.members[same[0]]
            merged = _Members()
        else:
            merged = self.own_members(moves, inside)
        for child in same:
            found = self.members[child]
            if found is _NO_MEMBERS:
                continue
            size = found.size()
            if size:
                self.budget -= size
                if self.budget < 0:
                    if id(found) not in self.collapsed:
                        self.collapsed[id(found)] = found.collapsed()
                    found = self.collapsed[id(found)]
            merged.add(found)
        return merged

    def own_members(self, moves: _Moves, inside: set[int] | None) -> _Members:
        here, nested = self.here, self.nested

        def checks(targets: list[int]) -> _Triple:
            at_member = below = back = 0
            for target in targets:
                at_member += here[target]
                if inside is not None and target in inside:
                    back += 1
                else:
                    below += nested[target]
            return (at_member, below, back)

        found = _Members()
        default = checks(moves.property_default)
        found.property_default = _sum(default, checks(moves.property_always))
        named = moves.property_named
        if default == _ZERO and (inside is None or inside.isdisjoint(named.values())):
            targets = named.values()
            triples = zip(
                map(here.__getitem__, targets),
                map(nested.__getitem__, targets),
                _ZEROS,
                strict=False,
            )
            found.property_delta = dict(zip(named, triples, strict=False))
        else:
            found.property_delta = {
                name: _difference(checks([target]), default)
                for name, target in moves.property_named.items()
            }
        default = checks(moves.item_default)
        found.item_default = _sum(default, checks(moves.item_always))
        found.item_delta = {
            position: _difference(checks(targets), default)
            for position, targets in moves.item_named.items()
        }
        found.key = checks(moves.key)
        return found
