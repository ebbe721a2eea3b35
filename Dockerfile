# lane-gateway image: the wheel only (no source tree), run as an unprivileged user.
#   docker build -t lane-gateway .
#   docker run -p 127.0.0.1:8080:8080 -v $PWD/routes.yaml:/app/routes.yaml:ro lane-gateway
#   docker run -p 127.0.0.1:8080:8080 lane-gateway gateway demo --host 0.0.0.0    # the shipped demo
# Stage 1 builds the wheel and the wheels of its dependencies; stage 2 installs only those.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md routes.yaml ./
COPY qualifications ./qualifications
COPY gateway ./gateway
RUN --mount=type=cache,target=/root/.cache/pip \
    pip wheel --wheel-dir /wheels . \
 && python -c "import zipfile,glob; n=zipfile.ZipFile(glob.glob('/wheels/lane_gateway-*.whl')[0]).namelist(); \
assert 'gateway/chat_templates/deepseek_v4.1.jinja' in n and 'gateway/demo/routes.yaml' in n, 'data files missing'"

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    GATEWAY_HOST=0.0.0.0 GATEWAY_PORT=8080 GATEWAY_DATA_DIR=/data GATEWAY_ROUTES=/app/routes.yaml
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels lane-gateway \
 && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin gateway \
 && mkdir -p /app /data && chown gateway:gateway /data
WORKDIR /app
USER gateway
VOLUME ["/data"]
EXPOSE 8080
# Process alive and answering (GET /healthz); /readyz also says whether the lanes' replicas answer.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os,urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('GATEWAY_PORT', '8080'), timeout=2)"]
CMD ["gateway", "serve"]
