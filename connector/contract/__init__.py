"""The wire contract (CONTRACT §1): schemas in `schemas/`, pydantic models, semantic rules, one `validate`
entry.

- `schemas`: load the JSON Schemas, `schema_violations(name, doc)`
- `models`: `MODELS[name]`, `validate_wire(name, doc)`, `WireModel.to_wire()`
- `semantic`: `document_violations`, `sequence_violations` (cross-poll rules)
- `validate`: `validate(name, doc_or_polls, via="schema" | "model")`
- `violations`: `Violation(path, rule)`; `patterns`: the patterns and bounds all three layers share
"""
