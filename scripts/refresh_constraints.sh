#!/usr/bin/env bash
# Re-resolves scripts/constraints.txt on purpose: installs without the pins into a fresh virtual
# environment (today's releases within pyproject.toml's ranges), runs README's test command there,
# and only if it passes writes the new tested set. Review the diff, then commit it.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(mktemp -d)/venv"
python3 -m venv "$venv"
# shellcheck disable=SC1091
source "$venv/bin/activate"
SPECDECODE_CONSTRAINTS=none bash scripts/install.sh
python3 -m pytest tests
{
    echo "# The tested set: what scripts/install.sh installs (pip -c). Written by scripts/refresh_constraints.sh"
    echo "# from a fresh virtual environment; refresh on purpose, run the tests, commit with the result."
    python3 -m pip freeze --exclude-editable | grep -vE '^(#|-e|specdecode)' | sed 's/+cpu$//'
} > scripts/constraints.txt
echo "scripts/constraints.txt refreshed from $venv; review with git diff"
