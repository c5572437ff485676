"""The evaluation job: the adapter beside its base on held-out chat records, before it is promoted.

Two programs, each in the image that has what it needs:
    python -m tpuforge_workloads.evaluate.loss --config C --out loss.json     (trainer image: JAX)
        held-out loss with the trainer's own code, base and adapter
    python -m tpuforge_workloads.evaluate.score --config C --loss loss.json   (evaluator image: vLLM)
        greedy answers from vLLM (base, and base + adapter), exact match, the committed report, and the
        result as the pod's termination message
C is an EvalConfig (tpuforge.api.configs). See docs/ml-engineer.md for the report's format.
"""
