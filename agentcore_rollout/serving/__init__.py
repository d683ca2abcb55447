"""What the project's servers share: the aiohttp base of the gateway, the policy server and the
runtime emulator (`server`), their command-line flags read from their configs (`flags`), JSON and
SSE helpers (`http`), and child processes that print their URL and exit with their parent
(`process`). Never imported by the core: it would load aiohttp's server side."""
