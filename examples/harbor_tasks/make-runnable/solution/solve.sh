#!/bin/bash
# The oracle's answer: a shebang that exists, and the execute bit.
sed -i '1s|.*|#!/bin/sh|' /app/report.sh
chmod +x /app/report.sh
