#!/bin/bash
#SBATCH --job-name=llm-pretrain
#SBATCH --account=team-a
#SBATCH --partition=h100
#SBATCH --qos=research
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=1-12:00:00
#SBATCH --output=logs/%x-%j.out
#SBATCH --mail-type=END,FAIL

# The shape of the Slurm documentation's batch scripts: directives first, then srun steps.
set -euo pipefail
echo "nodes: $SLURM_NNODES, node $SLURM_NODEID"
srun torchrun --nnodes "$SLURM_NNODES" --nproc-per-node 8 --node-rank "$SLURM_NODEID" \
     --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" train.py --config configs/7b.yaml
