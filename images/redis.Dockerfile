# Redis from Debian's package, for the compose file's redis service (FEDQUEUE_REDIS_IMAGE) where no
# registry serves redis:7.4-alpine. The service's own command writes the config (password) and starts it.
ARG DEBIAN_IMAGE=fedqueue-debian:bookworm
FROM ${DEBIAN_IMAGE}

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data && chown redis:redis /data

# The AOF lives on the volume mounted here; a new volume takes this folder's owner.
VOLUME /data
WORKDIR /data
USER redis
EXPOSE 6379
CMD ["redis-server", "--dir", "/data"]
