"""The local development cluster: a real Kubernetes control plane as local processes, with
kwok simulating RHEL 8 GPU nodes. No container engine needed.

- `build.sh`       builds etcd, the Kubernetes binaries, kwok and helm once per machine.
- `binaries`       finds that cache and runs the build when something is missing.
- `controlplane`   `LocalControlPlane`: start/stop the processes, TLS, token, kubeconfig.
- `nodes`          the simulated GPU node shapes and their Node manifests.
- `kwok/`          the kwok Stages (node and pod lifecycles, simulated exit codes).
- `cluster`        `local_cluster(...)`: all of the above in one context manager.
"""
