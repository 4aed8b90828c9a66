"""Training in processes, whatever the framework: launching ranks (``launch``), the rank
child (``_rank``), the pool of warm ranks (``rank_pool``) and the :class:`RankTrainer`
protocol a backend's ranks implement (``ranks``). Nothing here imports a framework."""
