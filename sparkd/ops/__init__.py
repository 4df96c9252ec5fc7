"""Operator tools behind sparkctl: capacity planning (plan), disk bandwidth (diskbench), the live
view (top). Each module owns its arguments (add_arguments) and its command (run); sparkctl only
wires them in."""
