"""tpuforge: fine-tune and serve LLMs on Cloud TPUs from Kubernetes."""

__version__ = "0.1.0"
