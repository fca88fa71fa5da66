"""rollwise.clients.vllm: vLLM servers for a run (launch, Ray placement, NCCL weight transfer, worker plugin)."""
