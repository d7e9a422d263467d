#!/bin/sh
# Short options and --gres, as the sbatch man page writes them: one node, four tasks sharing four A100s.
#SBATCH -J sweep-lr -N 1 -n 4
#SBATCH --gres=gpu:a100:4
#SBATCH -t 30
#SBATCH -p a100
#SBATCH -q spot
#SBATCH -A team-b
#SBATCH --export=NONE,LR=3e-4,WANDB_MODE=offline
#SBATCH --requeue
#SBATCH --frobnicate=yes

srun -l python sweep.py --lr "$LR" --task "$SLURM_PROCID"
#SBATCH --nodes=8
