# call A: park the first part of the GGUF and the first piece of the drafter weights on the machine
set -e
K=/tmp/k; mkdir -p $K/init
mv .dev/g1/part1 $K/part1; mv .dev/ia/* $K/init/
nvidia-smi -L || true; df -B1 --output=avail /tmp | tail -1; nproc; free -g | head -2
