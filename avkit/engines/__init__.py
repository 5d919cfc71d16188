"""Other engines avkit records from (each in its own process and venv): `vllm/`."""
