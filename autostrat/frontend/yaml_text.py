"""Reading a YAML config's text: PyYAML's safe loader, refusing what it would accept silently
(a key given twice) or slowly (flow collections nested hundreds deep), each as a `ConfigError`
naming the file and the place."""

from __future__ import annotations

import yaml

from autostrat.errors import ConfigError


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key, first, second) -> None:
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


# libyaml's scanner and parser (PyYAML's C loader, in every PyYAML wheel) with PyYAML's safe
# constructor: the same values and errors as the pure-Python SafeLoader, parsed about ten times
# faster (a config took 17 ms to parse, more than the rest of `load_config`).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(_SAFE_LOADER):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error (PyYAML
    would keep the last value silently). Merged keys (``<<: *base``) may still be overridden."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: SafeLoader rejects it below
                continue
            if first is not key_node:
                raise _DuplicateKey(key, first.start_mark, key_node.start_mark)
        return super().construct_mapping(node, deep)


def _place(mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


MAX_FLOW_DEPTH = 100  # levels of [ and { in one value; a real config uses 3 or 4


def flow_depth(text: str) -> tuple[int, int]:
    r"""The deepest nesting of YAML flow collections (``[`` and ``{``) in `text`, outside quoted
    scalars and comments, and the line (from 1) where it is first reached. PyYAML's scanner
    takes time quadratic in that depth before its composer runs out of stack (1.2 s for a line
    of 1 500 ``[``), so `parse_config_text` refuses a deep text before handing it over.

    Example:
        >>> flow_depth("a: 1\nb: [[1, '[['], {c: [2]}]  # [[[\nd: \"]]\"")
        (3, 2)
    """
    depth, deepest, deepest_line, line, quote, previous = 0, 0, 1, 1, "", "\n"
    index = 0
    while index < len(text):
        char = text[index]
        if quote:
            if char == "\\" and quote == '"':
                index += 1  # an escaped character does not end the scalar
            elif char == quote:
                quote = ""
        elif char in "'\"" and (previous in " \t\n[{,:-?" or depth):
            quote = char
        elif char == "#" and previous in " \t\n":
            while index + 1 < len(text) and text[index + 1] != "\n":
                index += 1  # a comment runs to the end of its line
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest, deepest_line = depth, line
        elif char in "]}":
            depth = max(depth - 1, 0)
        line += char == "\n"
        previous = char
        index += 1
    return deepest, deepest_line


def parse_config_text(text: str, path, keys: str = "parallel_mode, model, inputs, ...") -> dict:
    r"""The mapping a YAML config's `text` holds (`path` names it in errors): PyYAML's safe
    loader, with a key given twice, a flow nesting deeper than `MAX_FLOW_DEPTH`, invalid YAML
    or a text that is not a mapping (of `keys`, as the error says) refused as a `ConfigError`.

    Example:
        >>> parse_config_text("device_num: 8\nmodel: {name: FFN}\n", "a.yaml")
        {'device_num': 8, 'model': {'name': 'FFN'}}
    """
    depth, line = flow_depth(text)
    if depth > MAX_FLOW_DEPTH:
        raise ConfigError(f"{path}: not a usable config: values nested too deeply ({depth} levels of [ or {{ by line {line}; "
                          f"at most {MAX_FLOW_DEPTH})")
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except _DuplicateKey as error:
        raise ConfigError(f"{path}: key {error.key!r} appears twice in one mapping, at {_place(error.first)} "
                          f"and at {_place(error.second)}; give each key once") from None
    except yaml.YAMLError as error:
        if "maximum nesting depth" in str(getattr(error, "problem", "")):  # libyaml's limit (1 000 levels)
            raise ConfigError(f"{path}: not a usable config: values nested too deeply") from None
        mark = getattr(error, "problem_mark", None)
        place = f" at {_place(mark)}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{place}: {getattr(error, 'problem', error)}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not a usable config: values nested too deeply") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys ({keys}), got {type(data).__name__}")
    return data
