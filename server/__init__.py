"""What both servers stand on to serve: TLS and certificate reloading, the connection
guard (header and body deadlines, budgets, in-flight bound), the serve loop and its
shutdown, the collector policy, and the command-line helpers of their ``__main__``.

Layer: I/O shell over ``cluster`` (it may import ``cluster``; ``cluster`` never imports
it). Must not decide anything about jobs, queues, nodes or GPUs.
"""
