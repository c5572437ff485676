"""The controllers: what they share (runtime/), FineTuneJob (finetune/), ServingDeployment (serving/), and the
`tpuforge operator` entry point (main.py)."""
