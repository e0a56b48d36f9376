#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <rte_config.h>
#include <rte_errno.h>
#include <rte_log.h>
#include <rte_lcore.h>
#include <rte_cycles.h>
#include <rte_prefetch.h>
#include <rte_mbuf.h>
#include <rte_ring.h>
#include <rte_ethdev.h>

#include "shim.h"

uint16_t sluice_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n)
{
	return rte_eth_rx_burst(port, queue, pkts, n);
}

uint16_t sluice_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n)
{
	return rte_eth_tx_burst(port, queue, pkts, n);
}

int sluice_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned int n)
{
	return rte_pktmbuf_alloc_bulk(mp, mbufs, n);
}

/* rte_mbuf_raw_alloc for a burst: the mbufs as the pool holds them, not
 * reset (next NULL, nb_segs 1 and refcnt 1, as every free mbuf is). */
int sluice_mbuf_raw_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned int n)
{
	return rte_mempool_get_bulk(mp, (void **)mbufs, n);
}

struct rte_mbuf *sluice_pktmbuf_alloc(struct rte_mempool *mp)
{
	return rte_pktmbuf_alloc(mp);
}

void sluice_pktmbuf_free(struct rte_mbuf *m)
{
	rte_pktmbuf_free(m);
}

void sluice_prefetch0(const void *p)
{
	rte_prefetch0(p);
}

unsigned int sluice_lcore_id(void)
{
	return rte_lcore_id();
}

int sluice_errno(void)
{
	return rte_errno;
}

uint64_t sluice_rdtsc(void)
{
	return rte_rdtsc();
}

unsigned int sluice_ring_enqueue_burst(struct rte_ring *r, void *const *objs, unsigned int n)
{
	return rte_ring_enqueue_burst(r, objs, n, NULL);
}

unsigned int sluice_ring_dequeue_burst(struct rte_ring *r, void **objs, unsigned int n)
{
	return rte_ring_dequeue_burst(r, objs, n, NULL);
}

unsigned int sluice_ring_count(const struct rte_ring *r)
{
	return rte_ring_count(r);
}

/*
 * Output capture around rte_eal_init: DPDK writes its log (through a stream
 * on stdout), getopt's complaints (stderr) and its usage text (stdout)
 * straight to the process's descriptors. While capturing, descriptors 1 and
 * 2 point at a temporary file; stop restores them and returns what was
 * written. Afterwards DPDK's log goes to stderr, keeping stdout for output.
 */
static FILE *capture_file;
static int saved_out = -1;
static int saved_err = -1;

int sluice_capture_start(void)
{
	if (capture_file != NULL)
		return -1;
	fflush(stdout);
	fflush(stderr);
	capture_file = tmpfile();
	if (capture_file == NULL)
		return -1;
	saved_out = dup(STDOUT_FILENO);
	saved_err = dup(STDERR_FILENO);
	if (saved_out < 0 || saved_err < 0) {
		if (saved_out >= 0)
			close(saved_out);
		if (saved_err >= 0)
			close(saved_err);
		fclose(capture_file);
		capture_file = NULL;
		return -1;
	}
	dup2(fileno(capture_file), STDOUT_FILENO);
	dup2(fileno(capture_file), STDERR_FILENO);
	return 0;
}

char *sluice_capture_stop(void)
{
	char *out = NULL;
	long len;

	if (capture_file == NULL)
		return NULL;
	fflush(stdout);
	fflush(stderr);
	dup2(saved_out, STDOUT_FILENO);
	dup2(saved_err, STDERR_FILENO);
	close(saved_out);
	close(saved_err);
	saved_out = saved_err = -1;
	rte_openlog_stream(stderr);

	len = lseek(fileno(capture_file), 0, SEEK_END);
	if (len >= 0 && lseek(fileno(capture_file), 0, SEEK_SET) == 0) {
		out = malloc((size_t)len + 1);
		if (out != NULL) {
			ssize_t got = read(fileno(capture_file), out, (size_t)len);
			out[got > 0 ? got : 0] = '\0';
		}
	}
	fclose(capture_file);
	capture_file = NULL;
	return out;
}

void sluice_free(void *p)
{
	free(p);
}
