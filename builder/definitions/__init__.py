"""Stage 1, definitions: YAML with positions, the schema language, the definition tables, loading."""
