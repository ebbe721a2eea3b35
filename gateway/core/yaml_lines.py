"""Where a key path of a YAML file is written: the line an operator's editor should jump to.

Only asked when something is wrong (a refused config, a refused lane), so the file is composed again
then instead of carrying marks through every successful load.
"""

from __future__ import annotations

from collections.abc import Sequence

import yaml


def key_line(text: str, path: Sequence[str | int]) -> int | None:
    """1-based line of the deepest key of `path` found in `text` (None when not even the first is)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    line = None
    for part in path:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    line, node = key.start_mark.line + 1, value
                    break
            else:
                break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line
