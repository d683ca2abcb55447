#!/bin/bash
# The oracle's answer.
echo 'Hello from Harbor!' > /app/greeting.txt
