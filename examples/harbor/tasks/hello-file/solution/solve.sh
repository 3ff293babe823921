#!/bin/bash
# The reference solution (Harbor's `oracle` agent runs it).
echo hello > /app/hello.txt
