"""An agent started as a command, as a container image starts its server:
`python -m tests.agents.command` serves the plain bedrock-agentcore agent on `$PORT`."""

from __future__ import annotations

import os

from .plain import app

if __name__ == "__main__":
    app.run(port=int(os.environ["PORT"]), host="127.0.0.1")
