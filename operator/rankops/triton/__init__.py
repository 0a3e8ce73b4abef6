"""Talking to Triton (any KServe v2 server): the HTTP inference client (`client`), the recorded
and generated requests it sends (`samples`), and the Prometheus counters Triton serves
(`metrics`). Used by the gates, the warm container, canary analysis, autoscaling and
`rankops profile`; it imports nothing else of rankops."""
