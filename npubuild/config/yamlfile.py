"""Safe YAML loading that remembers where every value came from.

pydantic reports errors as a path of keys (`models.kws.path`); to turn that
into `file:line:col` we keep, for each path, the position of its node. Values
merged from `extends:` parents keep their own file's positions.

Hostile YAML is refused before it is built: the parser's events are scanned
once (the parser is a state machine, the composer and constructor recurse),
refusing nesting deeper than MAX_DEPTH and documents whose aliases expand to
more than MAX_VALUES values (a 500-byte "billion laughs" bomb grows to
gigabytes otherwise); the composer then replays the scanned events.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from npubuild.errors import InputError, Location

KeyPath = tuple[str | int, ...]
KEY = "<key>"  # marks[(*path, KEY)] is where the key itself is written (for unknown-key errors)
Marks = dict[KeyPath, Location]
MAX_DEPTH = 100  # nesting levels: a spec needs under 10
MAX_VALUES = 100_000  # scalars and collections after alias expansion: a 100-model nightly spec has a few thousand


class _Replay(yaml.SafeLoader):
    """A SafeLoader whose composer reads already-scanned parser events instead of parsing again."""

    def __init__(self, events: list[yaml.Event]):
        super().__init__("")
        self._events = deque(events)

    def check_event(self, *choices) -> bool:
        if not self._events:
            return False
        return not choices or isinstance(self._events[0], choices)

    def peek_event(self) -> yaml.Event:
        return self._events[0]

    def get_event(self) -> yaml.Event:
        return self._events.popleft()


def _event_mark(file: str, event: yaml.Event) -> Location:
    return Location(file, event.start_mark.line + 1, event.start_mark.column + 1)


def _scan(loader: yaml.SafeLoader, file: str) -> list[yaml.Event]:
    """All parser events, refusing deep nesting, recursive aliases and alias expansion past MAX_VALUES."""
    events: list[yaml.Event] = []
    stack: list[list] = []  # per open collection: [expanded size so far, anchor]
    sizes: dict[str, int] = {}  # anchor -> expanded size of its node
    total = [0]

    def add(n: int, event: yaml.Event) -> None:
        if stack:
            stack[-1][0] += n
            n = stack[-1][0]
        else:
            total[0] += n
            n = total[0]
        if n > MAX_VALUES:
            raise InputError(f"invalid YAML: expands to more than {MAX_VALUES} values (nested aliases?)",
                             _event_mark(file, event))

    while True:
        event = loader.get_event()
        events.append(event)
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if len(stack) >= MAX_DEPTH:
                raise InputError(f"invalid YAML: nested more than {MAX_DEPTH} levels deep", _event_mark(file, event))
            stack.append([1, event.anchor])
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            size, anchor = stack.pop()
            if anchor is not None:
                sizes[anchor] = size
            add(size, event)
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor is not None:
                sizes[event.anchor] = 1
            add(1, event)
        elif isinstance(event, yaml.AliasEvent):
            if any(a == event.anchor for _, a in stack):
                raise InputError(f"invalid YAML: alias '*{event.anchor}' refers to a value that contains it",
                                 _event_mark(file, event))
            add(sizes.get(event.anchor, 1), event)  # an undefined alias: the composer names it
        elif isinstance(event, yaml.StreamEndEvent):
            return events


def _reader_error(exc: yaml.reader.ReaderError, text: str, file: str) -> InputError:
    """A character YAML does not allow (a control character): one line with its position."""
    pos = exc.position if isinstance(exc.position, int) else 0
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    char = exc.character if isinstance(exc.character, str) else chr(exc.character)
    return InputError(f"invalid YAML: character U+{ord(char):04X} is not allowed (a control character?)",
                      Location(file, line, col))


def _decode_error(exc: UnicodeDecodeError, data: bytes, file: str) -> InputError:
    """Bytes that are not UTF-8, at their line and column (in characters, as an editor counts them)."""
    pos = exc.start
    line_start = data.rfind(b"\n", 0, pos) + 1
    line = data.count(b"\n", 0, pos) + 1
    col = len(data[line_start:pos].decode("utf-8", errors="replace")) + 1
    hint = " (the file looks like UTF-16: save it as UTF-8)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else \
        " (save the file as UTF-8)"
    return InputError(f"invalid YAML: byte 0x{data[pos]:02X} is not UTF-8{hint}", Location(file, line, col))


def _mark(file: str, node: yaml.Node) -> Location:
    return Location(file, node.start_mark.line + 1, node.start_mark.column + 1)


def _construct(loader: yaml.SafeLoader, node: yaml.Node, path: KeyPath, file: str, marks: Marks) -> Any:
    marks[path] = _mark(file, node)
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise InputError("mapping keys must be plain scalars", _mark(file, key_node))
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                raise InputError("mapping keys must be plain scalars", _mark(file, key_node))
            key = str(key)
            if key in out:
                raise InputError(f"duplicate key '{key}'", _mark(file, key_node))
            out[key] = _construct(loader, value_node, (*path, key), file, marks)
            marks[(*path, key, KEY)] = _mark(file, key_node)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(loader, item, (*path, i), file, marks) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def load_yaml(path: Path) -> tuple[Any, Marks]:
    """Load one YAML document safely; returns the data and a map key-path -> location."""
    file = str(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError("file not found", file) from None
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror or exc}", file) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _decode_error(exc, data, file) from None
    try:
        scanner = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:
        raise _reader_error(exc, text, file) from None
    try:
        with _yaml_errors(file):
            loader = _Replay(_scan(scanner, file))
    finally:
        scanner.dispose()
    try:
        with _yaml_errors(file):
            node = loader.get_single_node()
            if node is None:
                return {}, {(): Location(file, 1, 1)}
            marks: Marks = {}
            data = _construct(loader, node, (), file, marks)
            return data, marks
    finally:
        loader.dispose()


@contextmanager
def _yaml_errors(file: str) -> Iterator[None]:
    """PyYAML's errors as one InputError line, at the position it names when it names one."""
    try:
        yield
    except yaml.MarkedYAMLError as exc:
        raise _marked(exc, file) from None
    except yaml.YAMLError as exc:
        raise InputError(f"invalid YAML: {exc}", file) from None


def _marked(exc: yaml.MarkedYAMLError, file: str) -> InputError:
    mark = exc.problem_mark or exc.context_mark
    where = Location(file, mark.line + 1, mark.column + 1) if mark else Location(file)
    problem = exc.problem or exc.context or "malformed YAML"
    return InputError(f"invalid YAML: {problem}", where)


def deep_merge(base: Any, override: Any, base_marks: Marks, override_marks: Marks, path: KeyPath = ()) -> tuple[Any, Marks]:
    """Merge `override` onto `base` (mappings recursively, everything else replaced: later wins)."""
    marks: Marks = {}
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for p, loc in base_marks.items():
            marks[p] = loc
        for key, value in override.items():
            sub = (*path, key)
            if key in base:
                merged, sub_marks = deep_merge(
                    base[key],
                    value,
                    _subtree(base_marks, sub),
                    _subtree(override_marks, sub),
                    sub,
                )
                out[key] = merged
                _drop_subtree(marks, sub)
                marks.update(sub_marks)
            else:
                out[key] = value
                marks.update(_subtree(override_marks, sub))
        if path in override_marks:
            marks[path] = override_marks[path]
        return out, marks
    return override, _subtree(override_marks, path)


def _subtree(marks: Marks, prefix: KeyPath) -> Marks:
    n = len(prefix)
    return {p: loc for p, loc in marks.items() if p[:n] == prefix}


def _drop_subtree(marks: Marks, prefix: KeyPath) -> None:
    n = len(prefix)
    for p in [p for p in marks if p[:n] == prefix]:
        del marks[p]


def locate(marks: Marks, path: KeyPath, default: Location) -> Location:
    """The location of the longest known prefix of `path` (pydantic paths may go deeper than YAML)."""
    for n in range(len(path), -1, -1):
        loc = marks.get(tuple(path[:n]))
        if loc is not None:
            return loc
    return default
