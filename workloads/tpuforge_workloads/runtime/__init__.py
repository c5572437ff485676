"""What a pod's program uses to talk to the world: its config file, progress, TensorBoard, eval records, the
termination message, the compile cache, TPU access."""
