"""The coding agents as they ship, each at a pinned version, run headless on the task's
instruction and pointed at the gateway: Claude Code, the Codex CLI, mini-swe-agent and
OpenHands."""

from __future__ import annotations

from .launch import HarborAgent

CLI_AGENTS: tuple[HarborAgent, ...] = ()
