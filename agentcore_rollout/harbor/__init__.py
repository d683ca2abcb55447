"""Harbor tasks: task folders read into dataset rows (`tasks`), and the agent wrapper that
runs inside each task's environment (`app`)."""
