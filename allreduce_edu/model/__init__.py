"""The model of a network: what the course predicts and emulates, with no rank and no wire.

    costmodel   the α-β(-γ) formulas, one per algorithm (lessons 01, 05)
    portsim     per-rank programs run in virtual time on one full-duplex port per rank (lesson 16)
    links       the emulated network in real time: `Cluster(links=Links.flat("1ms", "100MB/s"))`
    tuner       NCCL's choice: predict every algorithm × protocol, take the fastest (lesson 05)

Above `ops` and `trace`, below everything that runs: `comm/` and `collectives/` import it.
"""
