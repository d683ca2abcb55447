"""A Harbor dataset of any size, for runs at dataset scale: `--tasks` small tasks over
`--environments` distinct environments, every `--separate`-th task with a verifier in an
environment of its own (`[verifier] environment_mode = "separate"`, its image built from
`tests/Dockerfile` with a checker the agent's image lacks, one image for all of them, the
answer handed over as an `artifacts` entry). With `oracle` every task scores 1, with `nop`
every task 0.

    python examples/harbor_dataset/generate.py out/harbor-dataset --tasks 24 --environments 6
    make run ARGS="--config configs/harbor-local.yaml --data out/harbor-dataset"
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

TASK_TOML = """\
version = "1.0"
{artifacts}
[agent]
timeout_sec = 600.0
user = "agent"

[verifier]
timeout_sec = 60.0
env = {{ ANSWER = "{answer}" }}
{verifier}
[environment]
build_timeout_sec = 600.0
cpus = 1
memory_mb = 1024
"""
SEPARATE = 'environment_mode = "separate"\n'
ARTIFACTS = 'artifacts = ["/app/answer.txt"]\n'
TEST_SH = """\
#!/bin/bash
# Harbor verifier: 1 if /app/answer.txt holds $ANSWER ([verifier] env), else 0.
mkdir -p /logs/verifier
got="$({read} /app/answer.txt 2>/dev/null)"
if [ -n "$ANSWER" ] && [ "$got" = "$ANSWER" ]; then r=1; else r=0; fi
echo $r > /logs/verifier/reward.txt
"""
CHECKER = "#!/bin/sh\n# Only the verifier's image has it.\ntr -d ' \\n' < \"$1\"\n"
VERIFIER_DOCKERFILE = """\
FROM python:3.11-slim
COPY check-answer /usr/local/bin/check-answer
RUN chmod 755 /usr/local/bin/check-answer
"""


def generate(into: Path, tasks: int, environments: int, separate: int) -> list[str]:
    """Write the dataset's task folders into `into` (emptied first); their names."""
    shutil.rmtree(into, ignore_errors=True)
    names = []
    for i in range(tasks):
        name = f"task-{i:04d}"
        env, answer = i % environments, 1000 + i
        folder = into / name
        for part in ("environment", "tests", "solution"):
            (folder / part).mkdir(parents=True)
        (folder / "instruction.md").write_text(f"Write the number {answer} into /app/answer.txt.\n")
        (folder / "environment" / "Dockerfile").write_text(
            f"FROM python:3.11-slim\nWORKDIR /app\nENV DATASET_ENVIRONMENT={env}\n"
            f"RUN echo {env} > /etc/dataset-environment\n"
            "RUN useradd --create-home --shell /bin/bash agent && chown -R agent:agent /app\n"
        )
        is_separate = separate > 0 and i % separate == separate - 1
        (folder / "task.toml").write_text(
            TASK_TOML.format(
                answer=answer,
                verifier=SEPARATE if is_separate else "",
                artifacts=ARTIFACTS if is_separate else "",
            )
        )
        read = "check-answer" if is_separate else "cat"
        _script(folder / "tests" / "test.sh", TEST_SH.format(read=read))
        if is_separate:
            (folder / "tests" / "Dockerfile").write_text(VERIFIER_DOCKERFILE)
            _script(folder / "tests" / "check-answer", CHECKER)
        _script(
            folder / "solution" / "solve.sh",
            f"#!/bin/bash\nmkdir -p /app\necho {answer} > /app/answer.txt\n",
        )
        names.append(name)
    return names


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("into", type=Path, help="the dataset's folder (emptied first)")
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--environments", type=int, default=6)
    parser.add_argument(
        "--separate", type=int, default=4, help="every N-th task's verifier is separate (0: none)"
    )
    args = parser.parse_args()
    names = generate(args.into, args.tasks, args.environments, args.separate)
    print(f"{len(names)} tasks over {args.environments} environments in {args.into}")


if __name__ == "__main__":
    main()
