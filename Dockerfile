FROM python:3.11-slim
WORKDIR /opt/harness
COPY pyproject.toml README.md ./
COPY protos protos
COPY gen gen
COPY services services
COPY irm_compute irm_compute
COPY cross_resource_scheduler cross_resource_scheduler
COPY irm_fpga irm_fpga
COPY application_manager application_manager
COPY examples examples
COPY bench bench
RUN pip install --no-cache-dir .
ENTRYPOINT ["harness"]
