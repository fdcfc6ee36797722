"""The medians of bench/peers/compare.sh's runs: prints a table and writes the headline
figures, "<name> <value>" a line, to RESULTS_FILE (compare.sh prints them as RESULT lines).

    python3 bench/peers/summary.py RUNS_FILE RESULTS_FILE

RUNS_FILE: one run a line, "<ranks> <name> <tok/s>", names hp_shm, hp_noshm (hp train with
and without shared-memory collectives) and the peers ddp, fsdp2, tp (bench/peers/peer.py),
any number of rounds each. Plain Python, no torch: any python3 runs it.
"""
import collections
import statistics
import sys

HP = ["hp_shm", "hp_noshm"]
PEERS = ["ddp", "fsdp2", "tp"]


def main(path, results_path):
    runs = collections.defaultdict(list)  # (ranks, name) -> tok/s of each round
    with open(path) as f:
        for line in f:
            ranks, name, value = line.split()
            runs[int(ranks), name].append(float(value))
    med = {key: statistics.median(values) for key, values in runs.items()}
    rounds = max(len(v) for v in runs.values())

    print(f"global tokens/s, median of {rounds} round(s); hp/best: hp over the fastest of "
          f"{', '.join(PEERS)}")
    names = HP + PEERS
    print(f"{'ranks':>5} " + " ".join(f"{n:>9}" for n in names) + f" {'best':>6} {'shm/best':>9} {'noshm/best':>10}")
    results = []
    for ranks in sorted({r for r, _ in med}):
        best = max(PEERS, key=lambda n: med.get((ranks, n), 0.0))
        best_value = med[ranks, best]
        ratio = {h: med[ranks, h] / best_value for h in HP}
        print(f"{ranks:>5} " + " ".join(f"{med[ranks, n]:>9.0f}" for n in names)
              + f" {best:>6} {ratio['hp_shm']:>8.2f}x {ratio['hp_noshm']:>9.2f}x")
        results += [f"peers_{ranks}r_shm_vs_best {ratio['hp_shm']:.3f}",
                    f"peers_{ranks}r_noshm_vs_best {ratio['hp_noshm']:.3f}"]
        results += [f"peers_{ranks}r_{n} {med[ranks, n]:.0f}" for n in names]
    with open(results_path, "w") as f:
        f.write("\n".join(results) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
