"""End-to-end tests against a live Kubernetes API server (`pytest e2e`)."""
