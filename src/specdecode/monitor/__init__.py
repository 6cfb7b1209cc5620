"""`specdecode monitor`: α, τ and per-position acceptance of a running server (vLLM or ours) from
its Prometheus /metrics, over sliding windows, with the drift alert of adaptive control."""
