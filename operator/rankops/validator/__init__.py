"""The node validator: checks a RHEL 8 GPU host through a read-only view of its files, reports
every check with a remedy, and (in the DaemonSet) labels and optionally taints its node."""
