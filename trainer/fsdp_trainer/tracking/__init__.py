"""Experiment trackers (spec.tracking): rank 0's series, written off the training thread.

One module per tracker, registered in ``registry.TRACKERS`` under its spec
field's name; ``open_tracking`` starts what the config asks for. The metrics
processor hands every point to ``Tracking.log``, which never blocks.
"""

from .background import Tracker, Tracking
from .registry import TRACKERS, open_tracking, tracker_problems
from .series import series_tag

__all__ = ["TRACKERS", "Tracker", "Tracking", "open_tracking", "series_tag", "tracker_problems"]
