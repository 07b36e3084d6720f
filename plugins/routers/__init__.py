"""kvbench's built-in routers: which prefill or decode worker a request goes to."""
