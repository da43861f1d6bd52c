"""The training's status, as pure functions: what one computation reads, its conditions, its phase and message.

``compute.compute_status`` turns the training's facts, its job and what the
pod loop saw (``inputs``) into the status; the conditions are one small
builder each (``condition_builders``, on ``conditions``' types and reasons;
``pod_report`` reads the pods); ``transitions`` derives the Events a change
posts, ``patch`` the merge patch that writes only what changed, and
``completion`` the progress and time left. Nothing here calls the API server.
"""
