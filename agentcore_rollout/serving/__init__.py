"""The servers' helpers: their aiohttp base, flags from configs, JSON and SSE, child processes.
Never imported by the core: it would load aiohttp's server side."""
