#!/usr/bin/env bash
# checkov on the CloudFormation template and the Terraform module.
#
# checkov lives in a venv of its own (default /tmp/checkov-venv, reused while its version is the
# pinned one): it pins boto3/botocore versions that clash with the project's AWS pins.
# --skip-download: checkov makes no calls to Prisma Cloud (there is no network here). Every
# suppression sits in the code with its reason: CDK resource metadata, `#checkov:skip=` in .tf.
set -euo pipefail

CHECKOV_VERSION=3.3.30
VENV=${CHECKOV_VENV:-/tmp/checkov-venv}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [[ "$("$VENV/bin/checkov" --version 2>/dev/null || true)" != "$CHECKOV_VERSION" ]]; then
  echo "installing checkov==$CHECKOV_VERSION into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "checkov==$CHECKOV_VERSION" \
    2> >(grep -v "^WARNING: Location" >&2)
fi

"$VENV/bin/checkov" --skip-download --compact --quiet --framework cloudformation \
  -d "$ROOT/infra/template"
"$VENV/bin/checkov" --skip-download --compact --quiet --framework terraform \
  -d "$ROOT/infra/terraform"
