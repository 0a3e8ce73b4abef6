"""rankops-dev: the dev harness beside the product (tests, the demo, `rankops dev`), never in its
wheel or images. It imports rankops' parts, never controller/ (kubeapi.py is its own API client);
rankops imports nothing of it and finds `rankops dev` through the `rankops.commands` entry point.

- `build.sh`       builds etcd, the Kubernetes binaries, kwok and helm once per machine.
- `binaries`       finds that cache and runs the build when something is missing.
- `controlplane`   `LocalControlPlane`: start/stop the processes, TLS, token, kubeconfig.
- `nodes`          the simulated GPU node shapes and their Node manifests.
- `kwok/`          the kwok Stages (node and pod lifecycles, simulated exit codes).
- `cluster`        `local_cluster(...)`: all of the above in one context manager.
- `real_cluster`   real nodes: a kubelet, containerd and runc per node, in a network namespace of its own.
- `image_builds`   the images, built here with buildah from Debian's packages.
- `sample_hosts`   the validator's sample RHEL 8 host trees and nvidia-smi XML.
- `commands/`      the `rankops dev ...` command lines.
"""
