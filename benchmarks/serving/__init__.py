"""The parts of the serving benchmark (benchmarks/serving_load.py, its command line): `load` (one load against
an endpoint and its statistics), `sweep` (input length x request rate, and the table), `vllm_cpu` (the local
server of the laptop run) and `adapter_vs_merged` (one fine-tune served two ways, compared)."""
