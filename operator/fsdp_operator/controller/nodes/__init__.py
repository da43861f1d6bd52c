"""The health of the nodes under a training: evidence against a node, and what the operator does about it.

``health`` reads a node's own conditions, ``xids`` new GPU XIDs from
dcgm-exporter's series in Prometheus, ``incidents`` repeated trainer failures
and stalls on one node, ``stragglers`` the rank its peers keep waiting for.
What the operator does about a suspect (taint it for trainings and restart the
pods elsewhere, spec.health.onSuspectNode exclude, within the admin's caps) is
``controller/node_exclusion.py``, a floor above the status it writes.
"""
