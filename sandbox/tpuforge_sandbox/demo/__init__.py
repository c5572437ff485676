"""`tpuforge demo`: a session (`session.DemoSession`, one run's state), plain step modules (`setup`, `follow`,
`results`, `evaluation`, `verilog`, `kueue`) whose functions take the session, and the demos as data
(`scenarios`: capitals, adapters, code, queue), picked by the command's options (`cli`)."""
