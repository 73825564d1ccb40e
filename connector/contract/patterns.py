"""Regular expressions and bounds shared by the schemas, the models and the semantic rules.

`tests/contract/test_schemas.py` checks that `schemas/common.defs.json` spells the very same patterns.
"""

from __future__ import annotations

import functools
import re

TIME_PATTERN = (
    r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?Z$"
)
OPERATION_ID_PATTERN = r"^deferred:[a-z0-9.]+:[A-Z2-7]{26}$"
OPERATION_KIND_PATTERN = r"^[a-z0-9.]+$"
ACTION_ID_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"
ERROR_CODE_PATTERN = r"^[a-z][a-z0-9-]*$"
UUID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
# Printable ASCII, one leading slash and never two (`//host` would leave the origin).
PATH_PATTERN = r"^/([!-.0-~][!-~]*)?$"

# I-JSON safe integers: RFC 8785 cannot canonicalise anything larger.
MAX_SAFE_INT = 2**53 - 1
MAX_TEXT = 256
MAX_ITEMS = 64
MAX_OPAQUE_ID = 128
MAX_LABEL = 64
MAX_TIME = 64


@functools.cache
def ecma(pattern: str) -> re.Pattern[str]:
    """Compile a schema pattern with ECMA-262's `$`: unlike Python's, it never matches before a newline."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)
