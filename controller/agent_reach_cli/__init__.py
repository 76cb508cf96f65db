"""The `reach` command: runs the processes and talks to a running controller."""
