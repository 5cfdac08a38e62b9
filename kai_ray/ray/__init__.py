"""Ray-side helper: GPU memory caps that match the pod's GPU fraction."""
