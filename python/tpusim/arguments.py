"""The CLI's argument list from Python values: what `tpusim.estimate(config, **overrides)`
hands to the C++ side is exactly the argv the CLI would get.

A config is a dict of keys (each becomes `key=value`), a path to a YAML file, a `key=value`
string, or a list of those, applied in order like the CLI's arguments (files over the embedded
base.yml, then the overrides). Values are written as YAML reads them back: True -> true,
None -> null, 1e-05 -> 1e-05, ["silu", "linear"] -> [silu, linear].

Example:
    command_args({"model_name": "llama3.1-8b"}, {"per_device_batch_size": 2})
      -> [b"model_name=llama3.1-8b", b"per_device_batch_size=2"]
"""

import math
import numbers
import os
from collections.abc import Mapping

from .errors import ConfigError

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def command_args(config, overrides):
    """argv tokens (bytes) for `config` followed by `overrides` (a dict). An override replaces
    the config's `key=value` of the same key (applied last, it wins; the CLI refuses a key given
    twice on one command line)."""
    tokens = []
    _add_config(config, tokens, depth=0)
    replaced = {key.encode("utf-8", "surrogateescape") + b"=" for key in overrides
                if isinstance(key, str)}
    tokens = [token for token in tokens if token[:token.find(b"=") + 1] not in replaced]
    _add_mapping(overrides, tokens)
    return tokens


def _add_config(config, tokens, depth):
    if config is None:
        return
    if isinstance(config, Mapping):
        _add_mapping(config, tokens)
    elif isinstance(config, (str, bytes, os.PathLike)):
        tokens.append(_token(os.fsdecode(config), "config"))
    elif isinstance(config, (list, tuple)) and depth == 0:
        for item in config:
            _add_config(item, tokens, depth + 1)
    else:
        raise ConfigError(
            "config: expected a dict of keys, a YAML file, a 'key=value' string or a list of "
            f"those, not {type(config).__name__}", "config")


def _add_mapping(mapping, tokens):
    for key, value in mapping.items():
        if not isinstance(key, str) or not key or "=" in key:
            raise ConfigError(f"{key!r} is not a config key (a name without '=')", str(key))
        tokens.append(_token(key + "=" + yaml_text(value), key))


def yaml_text(value):
    """A Python value as the YAML scalar or flow list the config reads."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        number = float(value)
        if math.isnan(number):
            return ".nan"
        if math.isinf(number):
            return ".inf" if number > 0 else "-.inf"
        return repr(number)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_text(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{key}: {yaml_text(item)}" for key, item in value.items()) + "}"
    if isinstance(value, os.PathLike):
        return os.fsdecode(value)
    return str(value)


def _token(text, key):
    """The bytes of one argument; text from the file system (surrogate-escaped) goes back to
    its bytes."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise ConfigError(f"{key}: {text!r} is not text tpusim can read (not UTF-8)",
                          key) from None


def text_option(name, value):
    """A string option (xla_flags, objective, a path) as bytes; None is ''."""
    if value is None:
        return b""
    if isinstance(value, (str, bytes, os.PathLike)):
        return _token(os.fsdecode(value), name)
    raise ConfigError(f"{name}: expected text, not {type(value).__name__}", name)


def list_option(name, value):
    """`without`: a list of names, or one comma-separated string, as --without takes them."""
    if value is None:
        return []
    if isinstance(value, (str, bytes)):
        value = os.fsdecode(value).split(",")
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{name}: expected a list of names, not {type(value).__name__}", name)
    return [text_option(name, item) for item in value]


def int_option(name, value, low, high):
    """An integer option (int, or its decimal text) within [low, high]."""
    number = value
    if isinstance(value, (str, bytes)):
        try:
            number = int(os.fsdecode(value).strip())
        except ValueError:
            raise ConfigError(f"{name}: {value!r} is not an integer", name) from None
    if isinstance(number, bool) or not isinstance(number, numbers.Integral):
        raise ConfigError(f"{name}: {value!r} is not an integer", name)
    if not low <= number <= high:
        raise ConfigError(f"{name}: {number} is out of range [{low}, {high}]", name)
    return int(number)


def float_option(name, value):
    """A number option (a real, or its text); the C++ side judges its range as the CLI does."""
    number = value
    if isinstance(value, (str, bytes)):
        try:
            number = float(os.fsdecode(value).strip())
        except ValueError:
            raise ConfigError(f"{name}: {value!r} is not a number", name) from None
    if isinstance(number, bool) or not isinstance(number, numbers.Real):
        raise ConfigError(f"{name}: {value!r} is not a number", name)
    return float(number)


def bool_option(name, value):
    if not isinstance(value, bool):
        raise ConfigError(f"{name}: expected True or False, not {value!r}", name)
    return value
